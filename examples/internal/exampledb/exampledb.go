// Package exampledb gives the example programs a fresh database: on the
// server named by a -uri flag or MONGODB_URI when there is one, otherwise on
// the embedded default server that mongotest starts (FerretDB behind a proxy
// that serializes wire exchanges; see the README for what that proves).
package exampledb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

// DB is a fresh database for one program run, with what its server can do.
type DB struct {
	// Database is the fresh database. Close drops it.
	*mongo.Database
	// Caps is what the server can do, found by store.Probe.
	Caps store.Capabilities
	// Where says in words which server this is, for the program's first
	// line of output.
	Where string
	// URI is the server's connection string, for programs this one starts
	// (through MONGODB_URI, never the command line: it may hold a
	// password). Never print it; Where is the printable form.
	URI string

	close func(context.Context) error
}

// URIFlag registers the -uri flag on fs (flag.CommandLine when nil) and
// returns its value's address. Its value goes to Open, which falls back on
// MONGODB_URI when it is empty. (The flag's default is not MONGODB_URI
// itself, so that -h never prints a password.)
func URIFlag(fs *flag.FlagSet) *string {
	if fs == nil {
		fs = flag.CommandLine
	}
	return fs.String("uri", "",
		"MongoDB connection string (default $MONGODB_URI; when both are empty, an embedded server is started)")
}

// Open returns a fresh database whose name starts with label. With a
// non-empty uri, or else a non-empty MONGODB_URI, it connects there with
// store's production defaults; otherwise it uses mongotest's shared server
// (Docker when an engine answers, else embedded FerretDB behind the
// serializing proxy). Call Close when done.
func Open(ctx context.Context, uri, label string) (*DB, error) {
	if uri == "" {
		uri = os.Getenv(mongotest.EnvURI)
	}
	if uri == "" {
		db, drop, err := mongotest.Open(ctx, label)
		if err != nil {
			return nil, err
		}
		where := fmt.Sprintf("%s server (%s)", db.Server.Backend, db.Server.Caps)
		if db.Server.Backend == mongotest.BackendEmbedded {
			where = fmt.Sprintf("the embedded server: FerretDB behind a proxy that serializes requests, which models\nMongoDB's single-document atomicity and no more (%s);\nrun with -uri or MONGODB_URI against real MongoDB for the rest", db.Server.Caps)
		}
		return &DB{Database: db.Database, Caps: db.Server.Caps, Where: where, URI: db.Server.URI, close: func(ctx context.Context) error {
			err := drop(ctx)
			mongotest.Shutdown()
			return err
		}}, nil
	}
	st, err := store.Connect(ctx, uri, &store.Options{AppName: "mongocas-examples"})
	if err != nil {
		return nil, err
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	db := st.Database("mongocas_" + label + "_" + hex.EncodeToString(b[:]))
	caps, err := st.Server().Capabilities(ctx, db)
	if err != nil {
		_ = st.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return &DB{Database: db, Caps: caps, Where: fmt.Sprintf("%s (%s)", store.RedactURI(uri), caps), URI: uri, close: func(ctx context.Context) error {
		return errors.Join(db.Drop(ctx), st.Close(ctx))
	}}, nil
}

// Close drops the database and lets go of the server: it disconnects a
// client Open made, and stops the embedded server if Open started one.
func (d *DB) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return d.close(ctx)
}
