// Command ferretdbserver runs FerretDB v1 (SQLite handler) on a free loopback
// port for mongotest, prints "LISTEN host:port" on its first line of output,
// and stops when its standard input closes (so it never outlives the test
// process that started it) or on SIGINT/SIGTERM.
//
// It is a module of its own, so that FerretDB and the database drivers it
// links (SQLite, PostgreSQL, MySQL, SAP HANA) never enter the module graph
// of a program that uses mongotest: mongotest builds this command once with
// the go command, into the user cache directory, and runs it as a child
// process. From a checkout (or a local replace of mongotest) it builds the
// sources beside mongotest; otherwise it runs
// `go install github.com/mongocas/mongocas/mongotest/ferretdbserver@V`,
// V being the version of mongotest itself (see mongotest's documentation).
// The go.mod here pins FerretDB v1.24.2 and has no replace directives, as
// `go install ...@V` requires.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	dir := flag.String("dir", "", "data directory (must exist)")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "ferretdbserver: -dir is required")
		os.Exit(2)
	}
	addr, stop, err := run(sqliteURL(*dir))
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
