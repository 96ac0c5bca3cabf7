package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"

	"github.com/FerretDB/FerretDB/ferretdb"
)

// sqliteURL is FerretDB's SQLite location for the data directory dir, one
// file per database. Test data need not survive a power cut, so SQLite does
// not wait for the disk on commit (synchronous off): about twice the write
// rate.
func sqliteURL(dir string) string {
	q := url.Values{"_pragma": {"synchronous(off)"}}
	return (&url.URL{Scheme: "file", Path: dir + "/", RawQuery: q.Encode()}).String()
}

// logLevel is Error, or Debug when MONGOCAS_FERRETDB_LOG is set.
func logLevel() slog.Level {
	if os.Getenv("MONGOCAS_FERRETDB_LOG") != "" {
		return slog.LevelDebug
	}
	return slog.LevelError
}

// run starts FerretDB on a free loopback port with its data at sqliteURL and
// returns its address and the function that stops it (and waits for it).
func run(sqliteURL string) (addr string, stop func(), err error) {
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: "127.0.0.1:0"},
		Handler:   "sqlite",
		SQLiteURL: sqliteURL,
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel()})),
	})
	if err != nil {
		return "", nil, fmt.Errorf("FerretDB: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = f.Run(ctx)
	}()
	stop = func() { cancel(); <-done }
	u, err := url.Parse(f.MongoDBURI())
	if err != nil || u.Host == "" {
		stop()
		return "", nil, fmt.Errorf("FerretDB gave no address (%q)", f.MongoDBURI())
	}
	return u.Host, stop, nil
}
