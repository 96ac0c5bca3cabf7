// Package shardtest captures every command a client sends to a collection
// and checks that each filter routes to one shard: it carries the _id's
// equality and an equality with each field of the shard key. The
// server-backed tests of versioned and lease use it with a compound shard
// key; on a sharded cluster (MONGOCAS_SHARD_KEY set, MONGODB_URI a mongos)
// it shards the test collection too and checks mongos's own count of the
// shards each command went to.
package shardtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/mongotest"
)

// EnvShardKey names the shard key of the sharded-cluster CI job: fields of
// the test documents ("region", "accountId"), separated by commas, each
// optionally ":hashed" ("region,accountId:hashed"). When it is set the
// tests shard their collection with it on the server, which must be a
// mongos. Unset, they configure the default key and shard nothing.
const EnvShardKey = "MONGOCAS_SHARD_KEY"

// Fields the test documents have, which a shard key may name.
const (
	Region    = "region"
	AccountID = "accountId"
)

// DefaultKey is the compound shard key the tests configure when
// EnvShardKey is unset.
var DefaultKey = []string{Region, AccountID}

// Key is the shard key under test.
type Key struct {
	// Fields are the fields, in order: Options.ShardKey.
	Fields []string
	// Spec is the key as shardCollection takes it ({field: 1 or "hashed"}).
	Spec bson.D
	// Sharded says the server is a mongos and the collection is to be
	// sharded: EnvShardKey was set.
	Sharded bool
}

// ShardKey returns the shard key under test: EnvShardKey's, or DefaultKey.
func ShardKey(t testing.TB) Key {
	t.Helper()
	env := strings.TrimSpace(os.Getenv(EnvShardKey))
	if env == "" {
		k := Key{Fields: DefaultKey}
		for _, f := range DefaultKey {
			k.Spec = append(k.Spec, bson.E{Key: f, Value: 1})
		}
		return k
	}
	k := Key{Sharded: true}
	for part := range strings.SplitSeq(env, ",") {
		name, kind, hashed := strings.Cut(strings.TrimSpace(part), ":")
		require.Contains(t, []string{Region, AccountID}, name, "%s=%q: the test documents have the fields %q and %q", EnvShardKey, env, Region, AccountID)
		var v any = 1
		if hashed {
			require.Equal(t, "hashed", kind, "%s=%q", EnvShardKey, env)
			v = "hashed"
		}
		k.Fields = append(k.Fields, name)
		k.Spec = append(k.Spec, bson.E{Key: name, Value: v})
	}
	return k
}

// Values returns a document's shard-key values as a Key's Shard takes them.
func (k Key) Values(region string, account int64) bson.D {
	var d bson.D
	for _, f := range k.Fields {
		switch f {
		case Region:
			d = append(d, bson.E{Key: f, Value: region})
		case AccountID:
			d = append(d, bson.E{Key: f, Value: account})
		}
	}
	return d
}

// Regions are the two regions of the test documents: on a sharded cluster
// each lives on its own shard.
var Regions = [2]string{"eu", "us"}

// Shard shards coll with k when k.Sharded, and places each of Regions on a
// shard of its own: the collection is split at region "m" and the chunk
// above is moved away. A command sent to all shards is then seen by both.
func (k Key) Shard(t testing.TB, coll *mongo.Collection) {
	t.Helper()
	if !k.Sharded {
		return
	}
	ctx := context.Background()
	admin := coll.Database().Client().Database("admin")
	ns := coll.Database().Name() + "." + coll.Name()
	run := func(cmd bson.D) error { return admin.RunCommand(ctx, cmd).Err() }
	require.NoError(t, run(bson.D{{Key: "enableSharding", Value: coll.Database().Name()}}), "%s is set: the server must be a mongos", EnvShardKey)
	require.NoError(t, run(bson.D{{Key: "shardCollection", Value: ns}, {Key: "key", Value: k.Spec}}))
	if k.Fields[0] != Region || k.Spec[0].Value != 1 {
		return // no ranged region prefix: the chunks are as the cluster made them
	}
	// Split at region "m"; the upper chunk's bounds name it for moveChunk
	// ("bounds" rather than "find", which a hashed field does not take).
	middle, top := bson.D{{Key: Region, Value: "m"}}, bson.D{{Key: Region, Value: bson.MaxKey{}}}
	for _, e := range k.Spec[1:] {
		middle = append(middle, bson.E{Key: e.Key, Value: bson.MinKey{}})
		top = append(top, bson.E{Key: e.Key, Value: bson.MaxKey{}})
	}
	require.NoError(t, run(bson.D{{Key: "split", Value: ns}, {Key: "middle", Value: middle}}))
	var shards struct {
		Shards []struct {
			ID string `bson:"_id"`
		} `bson:"shards"`
	}
	require.NoError(t, admin.RunCommand(ctx, bson.D{{Key: "listShards", Value: 1}}).Decode(&shards))
	require.GreaterOrEqual(t, len(shards.Shards), 2, "the cluster needs two shards")
	// Both chunks start on the database's primary shard: move the upper
	// one to whichever shard it is not on.
	var errs []error
	for _, s := range shards.Shards[:2] {
		err := run(bson.D{{Key: "moveChunk", Value: ns}, {Key: "bounds", Value: bson.A{middle, top}}, {Key: "to", Value: s.ID}})
		if err == nil {
			return
		}
		errs = append(errs, err)
	}
	require.NoError(t, errors.Join(errs...), "moveChunk")
}

// ShardByID shards coll on hashed _id when k.Sharded: the shard key
// recommended for a named lease's lock collection, every filter on which is
// by _id.
func (k Key) ShardByID(t testing.TB, coll *mongo.Collection) {
	t.Helper()
	if !k.Sharded {
		return
	}
	ns := coll.Database().Name() + "." + coll.Name()
	require.NoError(t, coll.Database().Client().Database("admin").RunCommand(context.Background(),
		bson.D{{Key: "shardCollection", Value: ns}, {Key: "key", Value: bson.D{{Key: "_id", Value: "hashed"}}}}).Err())
}

// Command is one command captured on a collection.
type Command struct {
	Coll string
	Name string
	Body bson.Raw
}

// Capture records the commands a client sends to some collections.
type Capture struct {
	colls []string
	mu    sync.Mutex
	cmds  []Command
}

// NewCapture returns a Capture of the commands sent to the collections
// named colls, and the ClientOptions that feed it (a command monitor).
func NewCapture(colls ...string) (*Capture, *options.ClientOptions) {
	c := &Capture{colls: colls}
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		target, ok := e.Command.Lookup(e.CommandName).StringValueOK()
		if !ok || !slices.Contains(c.colls, target) {
			return
		}
		body := make(bson.Raw, len(e.Command))
		copy(body, e.Command)
		c.mu.Lock()
		c.cmds = append(c.cmds, Command{Coll: target, Name: e.CommandName, Body: body})
		c.mu.Unlock()
	}}
	return c, options.Client().SetMonitor(mon)
}

// Take returns the commands captured since the last Take, and forgets them.
func (c *Capture) Take() []Command {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmds := c.cmds
	c.cmds = nil
	return cmds
}

// On returns the commands of cmds sent to the collection coll.
func On(cmds []Command, coll string) []Command {
	var out []Command
	for _, c := range cmds {
		if c.Coll == coll {
			out = append(out, c)
		}
	}
	return out
}

// Names lists the names of cmds, in order.
func Names(cmds []Command) []string {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = c.Name
	}
	return names
}

// Routes says, for an _id, which shard-key values its document has: the
// equalities every filter on it must carry. A nil Routes means any _id,
// found by its _id alone (a named lease's lock document).
type Routes map[string]bson.D

// Filters returns every filter in cmds: find's filter, each update and
// delete statement's q, findAndModify's query, an aggregate's first $match.
// An insert has none (mongos routes it by the document's own shard key);
// getMore and killCursors follow their cursor. Any other command fails t:
// nothing may reach the collection unchecked.
func Filters(t testing.TB, cmds []Command) []bson.Raw {
	t.Helper()
	var out []bson.Raw
	for _, c := range cmds {
		switch c.Name {
		case "find":
			out = append(out, doc(t, c, "filter"))
		case "findAndModify":
			out = append(out, doc(t, c, "query"))
		case "update", "delete":
			list := "updates"
			if c.Name == "delete" {
				list = "deletes"
			}
			stmts, err := c.Body.LookupErr(list)
			require.NoError(t, err, "%s has no %s: %s", c.Name, list, c.Body)
			vals, err := stmts.Array().Values()
			require.NoError(t, err)
			require.NotEmpty(t, vals)
			for _, v := range vals {
				q, err := v.Document().LookupErr("q")
				require.NoError(t, err, "%s statement without q: %s", c.Name, c.Body)
				out = append(out, q.Document())
			}
		case "aggregate":
			stages, err := c.Body.Lookup("pipeline").Array().Values()
			require.NoError(t, err)
			require.NotEmpty(t, stages)
			m, err := stages[0].Document().LookupErr("$match")
			require.NoError(t, err, "aggregate whose first stage is not $match: %s", c.Body)
			out = append(out, m.Document())
		case "insert", "getMore", "killCursors":
		default:
			require.Failf(t, "unexpected command", "%s on the collection: %s", c.Name, c.Body)
		}
	}
	return out
}

func doc(t testing.TB, c Command, field string) bson.Raw {
	t.Helper()
	v, err := c.Body.LookupErr(field)
	require.NoError(t, err, "%s has no %s: %s", c.Name, field, c.Body)
	d, ok := v.DocumentOK()
	require.True(t, ok, "%s's %s is not a document: %s", c.Name, field, c.Body)
	return d
}

// RequireTargeted fails t unless every filter in cmds has, at its top
// level, {_id: {$eq: id}} (or {_id: id}: see eqOf) and, for each field of the document's shard key
// (routes[id]), {field: {$eq: value}} with the document's value. It
// returns how many filters it checked, so that a caller can require there
// were some.
func RequireTargeted(t testing.TB, cmds []Command, routes Routes) int {
	t.Helper()
	filters := Filters(t, cmds)
	for _, f := range filters {
		id := eqOf(t, f, "_id")
		want, known := routes[id.String()]
		require.True(t, known || routes == nil, "filter on an _id the test did not expect: %s", f)
		for _, e := range want {
			got := eqOf(t, f, e.Key)
			typ, data, err := bson.MarshalValue(e.Value)
			require.NoError(t, err)
			require.True(t, same(got, bson.RawValue{Type: typ, Value: data}), "filter %s: %s is %s, want %v", f, e.Key, got, e.Value)
		}
	}
	return len(filters)
}

// eqOf returns v where filter has {key: {$eq: v}} at its top level, or
// {key: v} with v a string or an ObjectID (which no server reads as an
// operator), and fails t otherwise.
func eqOf(t testing.TB, filter bson.Raw, key string) bson.RawValue {
	t.Helper()
	v, err := filter.LookupErr(key)
	require.NoError(t, err, "filter without %q: a mongos would send it to every shard: %s", key, filter)
	if v.Type == bson.TypeString || v.Type == bson.TypeObjectID {
		return v
	}
	d, ok := v.DocumentOK()
	require.True(t, ok, "filter's %q is not {$eq: value}: %s", key, filter)
	elems, err := d.Elements()
	require.NoError(t, err)
	require.Len(t, elems, 1, "filter's %q is not {$eq: value}: %s", key, filter)
	require.Equal(t, "$eq", elems[0].Key(), "filter's %q is not {$eq: value}: %s", key, filter)
	return elems[0].Value()
}

// same compares two values as $eq does for the test's types: numbers by
// value, anything else by type and bytes.
func same(a, b bson.RawValue) bool {
	x, okA := a.AsInt64OK()
	y, okB := b.AsInt64OK()
	if okA && okB {
		return x == y
	}
	return a.Type == b.Type && string(a.Value) == string(b.Value)
}

// RouteOf is the Routes key of an _id.
func RouteOf(t testing.TB, id any) string {
	t.Helper()
	typ, data, err := bson.MarshalValue(id)
	require.NoError(t, err)
	return bson.RawValue{Type: typ, Value: data}.String()
}

// Targeting is mongos's count of the shards the commands it routed went
// to (serverStatus shardingStatistics.numHostsTargeted).
type Targeting map[string]map[string]int64

// ReadTargeting returns mongos's counts, or nil when k is not Sharded.
func (k Key) ReadTargeting(t testing.TB, db *mongotest.DB) Targeting {
	t.Helper()
	if !k.Sharded {
		return nil
	}
	var st struct {
		Sharding struct {
			Hosts map[string]map[string]int64 `bson:"numHostsTargeted"`
		} `bson:"shardingStatistics"`
	}
	require.NoError(t, db.Client().Database("admin").RunCommand(context.Background(), bson.D{{Key: "serverStatus", Value: 1}}).Decode(&st))
	require.NotEmpty(t, st.Sharding.Hosts, "serverStatus has no shardingStatistics.numHostsTargeted: is the server a mongos?")
	return st.Sharding.Hosts
}

// RequireOneShard fails t unless, between before and after, mongos sent
// no find, update, delete or aggregate to more than one shard, and sent
// some to one. On a server that is not a sharded cluster (before is nil)
// it does nothing.
func RequireOneShard(t testing.TB, before, after Targeting) {
	t.Helper()
	if before == nil {
		return
	}
	var one int64
	for _, op := range []string{"find", "update", "delete", "aggregate"} {
		for _, kind := range []string{"allShards", "manyShards"} {
			require.Equal(t, before[op][kind], after[op][kind], "mongos sent %s to %s", op, kind)
		}
		one += after[op]["oneShard"] - before[op]["oneShard"]
	}
	require.Positive(t, one, "mongos routed nothing to one shard: %s", fmt.Sprint(after))
}
