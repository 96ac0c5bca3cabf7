package store

import (
	"context"
	"fmt"
	"strings"

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

// ProbeCollection is the scratch collection Probe writes one short-lived
// document to. It is left empty afterwards.
const ProbeCollection = "mongocas_probe"

// Capabilities is what a server can do, as found by trying.
type Capabilities struct {
	// Topology is standalone, replica set or sharded, from hello.
	Topology Topology
	// FerretDB is true when buildInfo carries FerretDB's fields.
	FerretDB bool
	// Version is the version the server reports. It is informational only:
	// FerretDB v1 reports 7.0.42 while lacking features MongoDB 7.0 has.
	Version string
	// Transactions is true when a multi-document transaction started,
	// wrote and aborted.
	Transactions bool
	// RetryableWrites is true when the server supports sessions on a replica
	// set or sharded cluster, so the driver retries a write once after a
	// network error without applying it twice.
	RetryableWrites bool
	// Expr is true when a query filter with $expr comparing "$$NOW" works.
	Expr bool
	// UpdatePipelines is true when an update given as an aggregation
	// pipeline works.
	UpdatePipelines bool
	// TTLIndexes is true when the server accepted an index with
	// expireAfterSeconds and reports it back, and is not FerretDB v1 (which
	// accepts such indexes but never deletes expired documents).
	TTLIndexes bool
}

// String summarizes the capabilities in one line.
func (c Capabilities) String() string {
	var b strings.Builder
	name := "mongodb"
	if c.FerretDB {
		name = "ferretdb"
	}
	fmt.Fprintf(&b, "%s %s %s", name, c.Version, c.Topology)
	for _, f := range []struct {
		on   bool
		name string
	}{
		{c.Transactions, "transactions"},
		{c.RetryableWrites, "retryable-writes"},
		{c.Expr, "$expr/$$NOW"},
		{c.UpdatePipelines, "update-pipelines"},
		{c.TTLIndexes, "ttl-indexes"},
	} {
		if f.on {
			b.WriteString(" +" + f.name)
		} else {
			b.WriteString(" -" + f.name)
		}
	}
	return b.String()
}

// Probe finds what the server behind db can do by trying each feature, not
// by reading its version number. It runs hello and buildInfo, then works on
// one document it inserts into ProbeCollection and deletes at the end: a
// find with $expr and $$NOW, an update pipeline, a transaction that is
// aborted, and a TTL index on that collection. It needs read and write
// access to db. A feature whose attempt fails is reported absent; Probe
// itself fails only when the server cannot be reached or the probe document
// cannot be written.
func Probe(ctx context.Context, db *mongo.Database) (Capabilities, error) {
	var c Capabilities
	admin := db.Client().Database("admin")

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
	_, c.FerretDB = build["ferretdbVersion"]
	if !c.FerretDB {
		_, c.FerretDB = build["ferretdbFeatures"]
	}

	coll := db.Collection(ProbeCollection)
	id := bson.NewObjectID()
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "n", Value: 1}}); err != nil {
		return c, fmt.Errorf("store: probe: insert into %s.%s: %w", db.Name(), ProbeCollection, err)
	}
	defer func() { _, _ = coll.DeleteOne(context.WithoutCancel(ctx), bson.D{{Key: "_id", Value: id}}) }()

	c.Expr = probeExpr(ctx, coll, id)
	c.UpdatePipelines = probePipeline(ctx, coll, id)
	c.Transactions = probeTransactions(ctx, db.Client(), coll)
	c.TTLIndexes = !c.FerretDB && probeTTL(ctx, coll)
	return c, ctx.Err()
}

func probeExpr(ctx context.Context, coll *mongo.Collection, id bson.ObjectID) bool {
	filter := bson.D{
		{Key: "_id", Value: id},
		{Key: "$expr", Value: bson.D{{Key: "$lte", Value: bson.A{"$$NOW", "$$NOW"}}}},
	}
	n, err := coll.CountDocuments(ctx, filter)
	return err == nil && n == 1
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

func probeTransactions(ctx context.Context, client *mongo.Client, coll *mongo.Collection) bool {
	sess, err := client.StartSession()
	if err != nil {
		return false
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	if err := sess.StartTransaction(); err != nil {
		return false
	}
	sctx := mongo.NewSessionContext(ctx, sess)
	_, err = coll.InsertOne(sctx, bson.D{{Key: "_id", Value: bson.NewObjectID()}})
	abortErr := sess.AbortTransaction(context.WithoutCancel(ctx))
	return err == nil && abortErr == nil
}

func probeTTL(ctx context.Context, coll *mongo.Collection) bool {
	const name = "mongocas_probe_ttl"
	model := mongo.IndexModel{
		Keys:    bson.D{{Key: "mongocasProbeExpiresAt", Value: 1}},
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
