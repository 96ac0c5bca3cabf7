package deferred_test

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/tests/internal/shardtest"
	"github.com/mongocas/mongocas/versioned"
)

// TestEveryQueueQuerySeeks runs Enqueue and a worker through the paths of
// a job's life (a run of jobs, a lone job, a failed attempt, a cancelled
// head), records every filter they send to the queue's collections, and
// asks the server to explain each one as a find: none may scan its
// collection: DocumentDB plans no sequential scan; FerretDB v1, which
// filters in SQL only a lone _id equal to a string or an ObjectID
// (filterPushdown), takes that path for every lookup by one id. Every
// update statement of the jobs collection names one job by _id (but on
// FerretDB v1, where a filter of more than the _id scans whatever it
// holds: there an update of several jobs is one statement, one scan).
func TestEveryQueueQuerySeeks(t *testing.T) {
	b := setup(t)
	capture, copts := shardtest.NewCapture(b.jobs.Name(), b.jobs.Name()+"_keys")
	client, err := mongo.Connect(copts.ApplyURI(b.db.Server.URI))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	db := client.Database(b.db.Name())
	q := b.queue(t, db, nil)
	accounts, err := versioned.New[account](db.Collection("accounts"), nil)
	require.NoError(t, err)
	change, err := deferred.NewChange(q, "add", accounts, func(a *account, c credit) error { a.Balance += c.Amount; return nil })
	require.NoError(t, err)
	var calls atomic.Int64
	kind, err := deferred.Register(q, "flaky", func(ctx context.Context, job *deferred.Job, c credit) error {
		if calls.Add(1) == 1 {
			return errors.New("first attempt fails")
		}
		_, err := deferred.Guarded(ctx, job, accounts, "b", nil, bson.D{{Key: "$inc", Value: bson.D{{Key: "balance", Value: c.Amount}}}})
		return err
	})
	require.NoError(t, err)
	b.insert(t, "a", "b")
	var last bson.ObjectID
	for range 3 {
		last = enqueue(t, b.ctx, change, "a", credit{Amount: 1})
	}
	flaky := enqueue(t, b.ctx, kind, "b", credit{Amount: 1})
	enqueue(t, b.ctx, kind, "b", credit{Amount: 1})
	cancelled := enqueue(t, b.ctx, change, "c", credit{Amount: 1})
	require.NoError(t, q.Cancel(b.ctx, cancelled))
	enqueue(t, b.ctx, change, "c", credit{Amount: 1})
	run(t, q)
	wait(t, q, last)
	wait(t, q, flaky)

	seen, byID, v1 := map[string]bool{}, 0, false
	var updates []bson.Raw
	for _, c := range capture.Take() {
		if !slices.Contains([]string{"find", "findAndModify", "update", "delete", "aggregate"}, c.Name) {
			continue // inserts, and the index commands
		}
		sort, _ := c.Body.Lookup("sort").DocumentOK()
		for _, filter := range shardtest.Filters(t, []shardtest.Command{c}) {
			if c.Name == "update" && c.Coll == b.jobs.Name() {
				updates = append(updates, filter)
			}
			shape := c.Name + " " + c.Coll + " " + shapeOf(filter) + " " + shapeOf(sort)
			if !seen[shape] {
				seen[shape] = true
				byID += explainSeeks(t, b, c.Coll, filter, sort, shape, &v1)
			}
		}
	}
	require.NotEmpty(t, seen)
	if v1 {
		require.NotZero(t, byID, "no lookup by one id was seen")
		return // there an update of several jobs is one scan, not one per job
	}
	require.NotEmpty(t, updates)
	for _, filter := range updates {
		requireOneJob(t, filter)
	}
}

// requireOneJob fails t unless the update statement's filter names one job
// by its _id. Explaining it as a find does not show how a server plans an
// update of several: DocumentDB planned {_id: {$in: ids}, state: s} through
// the index on state, reading every job in state s (thousands under a
// backlog) for each claim of a run, where a statement per job finds each
// by _id.
func requireOneJob(t *testing.T, filter bson.Raw) {
	t.Helper()
	id, err := filter.LookupErr("_id")
	require.NoError(t, err, "an update of jobs names no job by _id: %s", filter)
	require.NotEqual(t, bson.TypeEmbeddedDocument, id.Type, "an update of jobs names several by _id: %s", filter)
}

// indexCond finds the index conditions of a Postgres plan as JSON.
var indexCond = regexp.MustCompile(`"Index Cond":"([^"]*)"`)

// explainSeeks asks the server to explain filter (and sort) on coll as a
// find and fails t on a scan; it returns 1 for a lookup by one id that
// FerretDB v1 pushed down, and sets v1 when the server is FerretDB v1.
func explainSeeks(t *testing.T, b *bundle, coll string, filter, sort bson.Raw, shape string, v1 *bool) int {
	t.Helper()
	cmd := bson.D{{Key: "find", Value: coll}, {Key: "filter", Value: filter}}
	if len(sort) > 0 {
		cmd = append(cmd, bson.E{Key: "sort", Value: sort})
	}
	var out bson.M
	require.NoError(t, b.db.RunCommand(b.ctx, bson.D{{Key: "explain", Value: cmd}, {Key: "verbosity", Value: "queryPlanner"}}).Decode(&out))
	plan, err := json.Marshal(out["queryPlanner"])
	require.NoError(t, err)
	t.Logf("%s\n\tpushdown=%v plan=%s", shape, out["filterPushdown"], plan)
	pushdown, isV1 := out["filterPushdown"]
	if !isV1 {
		require.NotContains(t, string(plan), "COLLSCAN", "%s scans its collection", shape)
		if strings.Contains(string(plan), "Node Type") {
			// DocumentDB's Postgres plan: a scan is a Seq Scan, or an index
			// scan whose only condition is the collection's shard.
			seek := false
			for _, c := range indexCond.FindAllStringSubmatch(string(plan), -1) {
				seek = seek || strings.Contains(c[1], "object_id") || strings.Contains(c[1], "document OPERATOR")
			}
			require.NotContains(t, string(plan), "Seq Scan", "%s scans its collection", shape)
			require.True(t, seek, "%s scans its collection: no index condition on it", shape)
		}
		return 0
	}
	// FerretDB v1 (SQLite) filters in SQL only a lone _id equal to a string
	// or an ObjectID (filterPushdown), and decodes and filters every
	// document for any other filter, whatever the indexes: a lookup by one
	// id must take that path; the others are logged above.
	*v1 = true
	elems, _ := filter.Elements()
	if len(elems) != 1 || elems[0].Key() != "_id" || elems[0].Value().Type == bson.TypeEmbeddedDocument {
		return 0
	}
	require.Equal(t, true, pushdown, "%s scans its collection", shape)
	return 1
}

// shapeOf is a filter's field names and operators, without its values.
func shapeOf(d bson.Raw) string {
	if len(d) == 0 {
		return "{}"
	}
	var sb strings.Builder
	elems, _ := d.Elements()
	sb.WriteString("{")
	for _, e := range elems {
		sb.WriteString(e.Key() + ":")
		switch v := e.Value(); v.Type {
		case bson.TypeEmbeddedDocument:
			sb.WriteString(shapeOf(v.Document()))
		case bson.TypeArray:
			vals, _ := v.Array().Values()
			sb.WriteString("[")
			for _, x := range vals {
				if doc, ok := x.DocumentOK(); ok {
					sb.WriteString(shapeOf(doc))
				}
			}
			sb.WriteString("]")
		default:
			sb.WriteString("_")
		}
		sb.WriteString(" ")
	}
	sb.WriteString("}")
	return sb.String()
}
