// Package embedded runs FerretDB v1 (SQLite handler) in the calling process.
// mongotest uses it directly, or through the ferretdbserver command when the
// test binary is race-instrumented (FerretDB's SQLite is slow under -race and
// is not our code to check).
package embedded

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"

	"github.com/FerretDB/FerretDB/ferretdb"
)

// SQLiteURL is FerretDB's SQLite location for the data directory dir, one
// file per database. Test data need not survive a power cut, so SQLite does
// not wait for the disk on commit (synchronous off): about twice the write
// rate.
func SQLiteURL(dir string) string {
	q := url.Values{"_pragma": {"synchronous(off)"}}
	return (&url.URL{Scheme: "file", Path: dir + "/", RawQuery: q.Encode()}).String()
}

// LogLevel is Error, or Debug when MONGOCAS_FERRETDB_LOG is set.
func LogLevel() slog.Level {
	if os.Getenv("MONGOCAS_FERRETDB_LOG") != "" {
		return slog.LevelDebug
	}
	return slog.LevelError
}

// Run starts FerretDB on a free loopback port with its data at sqliteURL and
// returns its address and the function that stops it (and waits for it).
func Run(sqliteURL string) (addr string, stop func(), err error) {
	f, err := ferretdb.New(&ferretdb.Config{
		Listener:  ferretdb.ListenerConfig{TCP: "127.0.0.1:0"},
		Handler:   "sqlite",
		SQLiteURL: sqliteURL,
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: LogLevel()})),
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
