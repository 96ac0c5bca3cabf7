// Command mongodbserver runs MongoDB in Docker for mongotest: a single-node
// replica set (so that transactions, retryable writes and majority reads are
// real) started through testcontainers-go's MongoDB module. It prints one
// line on its standard output and then keeps the server up:
//
//	URI mongodb://127.0.0.1:32768/?directConnection=true
//
// or, when no Docker engine answers (so that mongotest can fall back to its
// embedded server and say why), exits with status 3 after printing
//
//	NODOCKER <what testcontainers-go said>
//
// Any other failure is a line on standard error and status 1; bad flags are
// status 2. The server stops, and its container is removed, when standard
// input closes (the test process that started it exited) or on
// SIGINT/SIGTERM. If this process is killed, testcontainers-go's reaper
// (Ryuk) removes the container once this process's connection to it drops.
//
// Flags:
//
//	-image    the MongoDB image, such as mongo:7.0 (required)
//	-replset  the replica set's name (default rs0)
//	-timeout  how long the start may take, the image pull included (default 3m)
//
// It is a module of its own, like mongotest/ferretdbserver, so that
// testcontainers-go and the Docker client it links never enter the module
// graph of a program that uses mongotest: mongotest builds this command once
// with the go command, into the user cache directory, and runs it as a child
// process. Its go.mod has no replace directives, as `go install ...@V`
// requires.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Exit statuses besides 0 and 1.
const (
	exitUsage    = 2
	exitNoDocker = 3
)

func main() {
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "mongodbserver:", err)
		}
		os.Exit(exitUsage)
	}
	os.Exit(run(cfg, os.Stdin, os.Stdout, log.New(os.Stderr, "mongodbserver: ", 0)))
}

// run starts the server, prints its line to out, waits for in to close or a
// signal, and stops it. It returns the exit status.
func run(cfg config, in io.Reader, out io.Writer, logger *log.Logger) int {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	defer cancel()
	if err := dockerAnswers(ctx); err != nil {
		fmt.Fprintln(out, noDockerLine(err))
		return exitNoDocker
	}
	srv, err := start(ctx, cfg, logger)
	if err != nil {
		logger.Print(err)
		return 1
	}
	defer func() {
		if err := srv.stop(); err != nil {
			logger.Print(err)
		}
	}()
	fmt.Fprintln(out, uriLine(srv.uri))

	// As ferretdbserver does: the two commands share no code, since each
	// must build alone with go install module@version.
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, in)
		close(eof)
	}()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-eof:
	case <-sig:
	}
	return 0
}

// server is a running MongoDB and the function that removes it.
type server struct {
	uri  string
	stop func() error
}

// healthTimeout bounds the question whether a Docker engine answers.
const healthTimeout = 5 * time.Second
