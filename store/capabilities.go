package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Topology is how the server is deployed.
type Topology string

// The topologies Probe tells apart.
const (
	Standalone Topology = "standalone"
	ReplicaSet Topology = "replicaset"
	Sharded    Topology = "sharded"
)

// ServerKind is the kind of server behind a connection, from buildInfo.
type ServerKind string

// The server kinds Probe tells apart.
const (
	// MongoDB is MongoDB itself, or any server that does not say in
	// buildInfo that it is FerretDB.
	MongoDB ServerKind = "mongodb"
	// FerretDBv1 is FerretDB 1.x (buildInfo has ferretdbVersion). Its
	// conditional writes are not atomic under concurrency, and it accepts
	// TTL indexes but never deletes.
	FerretDBv1 ServerKind = "ferretdb-v1"
	// FerretDBv2 is FerretDB 2.x (buildInfo has a ferretdb document) on
	// PostgreSQL with the DocumentDB extension. It has no multi-document
	// transactions, and reports some errors as PostgreSQL's (see
	// IsDuplicateKey).
	FerretDBv2 ServerKind = "ferretdb-v2"
)

// ProbeCollection starts the name of the scratch collection each Probe
// writes its short-lived documents to: ProbeCollection, "_", and the
// probe's own id, so that probes running at once never touch each other's.
// Probe drops it at the end.
const ProbeCollection = "mongocas_probe"

// Capabilities is what a server can do, as found by trying.
type Capabilities struct {
	// Topology is standalone, replica set or sharded, from hello.
	Topology Topology
	// Server is the kind of server, from buildInfo, for messages and for
	// working around a server's known divergences.
	Server ServerKind
	// Version is the version the server reports, for information only.
	Version string
	// Transactions is true when a document inserted in a transaction that
	// is then aborted is gone afterwards, and one inserted in a transaction
	// that is committed is there.
	Transactions bool
	// RetryableWrites is true when the server supports sessions on a replica
	// set or sharded cluster, so the driver retries a write once after a
	// network error without applying it twice.
	RetryableWrites bool
	// Expr is true when $expr comparing a field to "$$NOW" selects the right
	// document in the filter of a findOneAndUpdate, and "$$NOW" in an update
	// pipeline stores the server's current date.
	Expr bool
	// UpdatePipelines is true when an update given as an aggregation
	// pipeline works.
	UpdatePipelines bool
	// TTLIndexes is true when the server accepted an index with
	// expireAfterSeconds and reports it back, and is not FerretDB v1.
	TTLIndexes bool
}

// String summarizes the capabilities in one line: server, version,
// topology, then each feature after a + (present) or a - (absent).
func (c Capabilities) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s", c.Server, c.Version, c.Topology)
	names := []string{"transactions", "retryable-writes", "$expr/$$NOW", "update-pipelines", "ttl-indexes"}
	for i, on := range []bool{c.Transactions, c.RetryableWrites, c.Expr, c.UpdatePipelines, c.TTLIndexes} {
		sign := " -"
		if on {
			sign = " +"
		}
		b.WriteString(sign + names[i])
	}
	return b.String()
}

// Probe finds what the server behind db can do by trying each feature and
// checking its effect, not by reading its version number: hello and
// buildInfo, then each test its Capabilities field describes, on documents
// of a scratch collection of its own (see ProbeCollection) that it drops at
// the end. It needs read and write access to db. A feature whose attempt fails, or does not have its effect,
// is reported absent; Probe fails only when the server cannot be reached or
// the probe document cannot be written. Server.Capabilities probes once per
// client.
func Probe(ctx context.Context, db *mongo.Database) (Capabilities, error) {
	c, err := identify(ctx, db.Client())
	if err != nil {
		return c, err
	}
	return try(ctx, db, c)
}

// identify fills the fields of Capabilities that hello and buildInfo tell.
func identify(ctx context.Context, client *mongo.Client) (Capabilities, error) {
	var c Capabilities
	admin := client.Database("admin")

	var hello struct {
		SetName                      string `bson:"setName"`
		Msg                          string `bson:"msg"`
		LogicalSessionTimeoutMinutes *int64 `bson:"logicalSessionTimeoutMinutes"`
	}
	if err := admin.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		return c, fmt.Errorf("store: probe: hello: %w", err)
	}
	switch {
	case hello.Msg == "isdbgrid":
		c.Topology = Sharded
	case hello.SetName != "":
		c.Topology = ReplicaSet
	default:
		c.Topology = Standalone
	}
	c.RetryableWrites = c.Topology != Standalone && hello.LogicalSessionTimeoutMinutes != nil

	var build bson.M
	if err := admin.RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Decode(&build); err != nil {
		return c, fmt.Errorf("store: probe: buildInfo: %w", err)
	}
	c.Version, _ = build["version"].(string)
	c.Server = serverKind(build)
	return c, nil
}

// try fills the fields of c that Probe finds by trying.
func try(ctx context.Context, db *mongo.Database, c Capabilities) (Capabilities, error) {
	id := bson.NewObjectID()
	coll := db.Collection(ProbeCollection + "_" + id.Hex())
	past := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	doc := bson.D{{Key: "_id", Value: id}, {Key: "n", Value: 1}, {Key: "t", Value: past}}
	// Dropped even when the insert fails: a lost reply may hide one that
	// created the collection.
	defer func() { _ = coll.Drop(context.WithoutCancel(ctx)) }()
	if _, err := coll.InsertOne(ctx, doc); err != nil {
		return c, fmt.Errorf("store: probe: insert into %s.%s: %w", db.Name(), coll.Name(), err)
	}

	c.Expr = probeExpr(ctx, coll, id, past)
	c.UpdatePipelines = probePipeline(ctx, coll, id)
	c.Transactions = probeTransactions(ctx, db.Client(), coll, id)
	c.TTLIndexes = c.Server != FerretDBv1 && probeTTL(ctx, coll, id)
	return c, ctx.Err()
}

// serverKind tells the ServerKind from a buildInfo reply.
func serverKind(build bson.M) ServerKind {
	if _, ok := build["ferretdb"]; ok {
		return FerretDBv2
	}
	_, v1 := build["ferretdbVersion"]
	_, v1f := build["ferretdbFeatures"]
	if v1 || v1f {
		return FerretDBv1
	}
	return MongoDB
}

// probeExpr checks $expr with $$NOW in a write filter, matching and not
// matching, and $$NOW in an update pipeline.
func probeExpr(ctx context.Context, coll *mongo.Collection, id bson.ObjectID, past time.Time) bool {
	exprFilter := func(op string) bson.D {
		return bson.D{
			{Key: "_id", Value: id},
			{Key: "$expr", Value: bson.D{{Key: op, Value: bson.A{"$t", "$$NOW"}}}},
		}
	}
	mark := func(v string) bson.D { return bson.D{{Key: "$set", Value: bson.D{{Key: "e", Value: v}}}} }
	// Both together rule out a $$NOW read as null or a string.
	err := coll.FindOneAndUpdate(ctx, exprFilter("$gt"), mark("wrong")).Err()
	if !errors.Is(err, mongo.ErrNoDocuments) {
		return false
	}
	if err := coll.FindOneAndUpdate(ctx, exprFilter("$lt"), mark("right")).Err(); err != nil {
		return false
	}
	pipe := mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "now", Value: "$$NOW"}}}}}
	if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, pipe); err != nil {
		return false
	}
	var got struct {
		E   string        `bson:"e"`
		Now bson.RawValue `bson:"now"`
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&got); err != nil {
		return false
	}
	now, ok := got.Now.DateTimeOK()
	return got.E == "right" && ok && time.UnixMilli(now).After(past)
}

func probePipeline(ctx context.Context, coll *mongo.Collection, id bson.ObjectID) bool {
	pipe := mongo.Pipeline{{{Key: "$set", Value: bson.D{{Key: "n", Value: bson.D{{Key: "$add", Value: bson.A{"$n", 1}}}}}}}}
	res, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, pipe)
	if err != nil || res.ModifiedCount != 1 {
		return false
	}
	var doc struct {
		N int64 `bson:"n"`
	}
	return coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&doc) == nil && doc.N == 2
}

// probeTransactions inserts a document in a transaction it aborts, and one
// in a transaction it commits, and reads both back outside the session: the
// first must be gone and the second there.
func probeTransactions(ctx context.Context, client *mongo.Client, coll *mongo.Collection, probe bson.ObjectID) bool {
	sess, err := client.StartSession()
	if err != nil {
		return false
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	insert := func(id bson.ObjectID) error {
		if err := sess.StartTransaction(); err != nil {
			return err
		}
		_, err := coll.InsertOne(mongo.NewSessionContext(ctx, sess), bson.D{{Key: "_id", Value: id}, {Key: "probe", Value: probe}})
		return err
	}
	exists := func(id bson.ObjectID) (bool, error) {
		n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: id}})
		return n == 1, err
	}

	aborted := bson.NewObjectID()
	err = insert(aborted)
	_ = sess.AbortTransaction(context.WithoutCancel(ctx)) // its error is not reported
	if err != nil {
		return false
	}
	if there, err := exists(aborted); err != nil || there {
		return false
	}

	committed := bson.NewObjectID()
	if err := insert(committed); err != nil {
		_ = sess.AbortTransaction(context.WithoutCancel(ctx))
		return false
	}
	if err := sess.CommitTransaction(ctx); err != nil {
		return false
	}
	there, err := exists(committed)
	return err == nil && there
}

// probeTTL reports whether coll accepts an index with expireAfterSeconds
// and reports it back. The index is this probe's own: two probes at once
// do not drop each other's.
func probeTTL(ctx context.Context, coll *mongo.Collection, id bson.ObjectID) bool {
	name := "mongocas_probe_ttl_" + id.Hex()
	model := mongo.IndexModel{
		Keys:    bson.D{{Key: "mongocasProbeExpiresAt_" + id.Hex(), Value: 1}},
		Options: options.Index().SetName(name).SetExpireAfterSeconds(3600),
	}
	if _, err := coll.Indexes().CreateOne(ctx, model); err != nil {
		return false
	}
	defer func() { _ = coll.Indexes().DropOne(context.WithoutCancel(ctx), name) }()
	cur, err := coll.Indexes().List(ctx)
	if err != nil {
		return false
	}
	var idx []bson.M
	if err := cur.All(ctx, &idx); err != nil {
		return false
	}
	for _, ix := range idx {
		if ix["name"] == name {
			_, ok := ix["expireAfterSeconds"]
			return ok
		}
	}
	return false
}
