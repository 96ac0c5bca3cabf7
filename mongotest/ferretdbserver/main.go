// Command ferretdbserver runs FerretDB v1 (SQLite handler) on a free loopback
// port for mongotest, prints "LISTEN host:port" on its first line of output,
// and stops when its standard input closes (so it never outlives the test
// process that started it) or on SIGINT/SIGTERM.
//
// mongotest builds and starts it by itself when the test binary is built
// with -race: FerretDB's SQLite engine is several times slower under the race
// detector, and it is not our code to check.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/mongocas/mongocas/mongotest/internal/embedded"
)

func main() {
	dir := flag.String("dir", "", "data directory (must exist)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "ferretdbserver: -dir is required")
		os.Exit(2)
	}
	addr, stop, err := embedded.Run(embedded.SQLiteURL(*dir))
	if err != nil {
		fmt.Fprintln(os.Stderr, "ferretdbserver:", err)
		os.Exit(1)
	}
	fmt.Println("LISTEN", addr)

	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(eof)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-eof:
	case <-sig:
	}
	stop()
}
