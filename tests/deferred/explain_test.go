package deferred_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/versioned"
)

// query is a filter (and sort) a command sent to a collection.
type query struct {
	cmd, coll    string
	filter, sort bson.Raw
}

// queries records the filters of the commands a client sends.
type queries struct {
	mu  sync.Mutex
	all []query
}

func (qs *queries) started(_ context.Context, e *event.CommandStartedEvent) {
	c := e.Command
	coll, _ := c.Lookup(e.CommandName).StringValueOK()
	add := func(filter, sort bson.RawValue) {
		f, _ := filter.DocumentOK()
		s, _ := sort.DocumentOK()
		qs.mu.Lock()
		qs.all = append(qs.all, query{cmd: e.CommandName, coll: coll, filter: f, sort: s})
		qs.mu.Unlock()
	}
	switch e.CommandName {
	case "find":
		add(c.Lookup("filter"), c.Lookup("sort"))
	case "findAndModify", "count":
		add(c.Lookup("query"), c.Lookup("sort"))
	case "update", "delete":
		field := map[string]string{"update": "updates", "delete": "deletes"}[e.CommandName]
		stmts, _ := c.Lookup(field).Array().Values()
		for _, s := range stmts {
			add(s.Document().Lookup("q"), bson.RawValue{})
		}
	case "aggregate":
		stages, _ := c.Lookup("pipeline").Array().Values()
		if len(stages) > 0 {
			add(stages[0].Document().Lookup("$match"), bson.RawValue{})
		}
	}
}

// TestEveryQueueQuerySeeks runs Enqueue and a worker through the paths of
// a job's life (a run of jobs, a lone job, a failed attempt, a cancelled
// head), records every filter they send to the queue's collections, and
// asks the server to explain each one as a find: none may scan its
// collection. FerretDB v1 pushes down only a filter of one _id equal to a
// string or an ObjectID (filterPushdown), DocumentDB plans with indexes
// (no COLLSCAN stage).
func TestEveryQueueQuerySeeks(t *testing.T) {
	b := setup(t)
	qs := &queries{}
	client, err := mongo.Connect(options.Client().ApplyURI(b.db.Server.URI).SetMonitor(&event.CommandMonitor{Started: qs.started}))
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Disconnect(context.Background()) })
	db := client.Database(b.db.Name())
	q := b.queue(t, db, nil)
	accounts, err := versioned.New[account](db.Collection("accounts"), nil)
	require.NoError(t, err)
	change, err := deferred.NewChange(q, "add", accounts, func(a *account, c credit) error { a.Balance += c.Amount; return nil })
	require.NoError(t, err)
	failOnce := 0
	kind, err := deferred.Register(q, "flaky", func(ctx context.Context, job *deferred.Job, c credit) error {
		if failOnce++; failOnce == 1 {
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

	qs.mu.Lock()
	all := qs.all
	qs.mu.Unlock()
	seen, byID, v1 := map[string]bool{}, 0, false
	for _, qu := range all {
		if qu.coll != b.jobs.Name() && qu.coll != b.jobs.Name()+"_keys" {
			continue
		}
		shape := qu.cmd + " " + qu.coll + " " + shapeOf(qu.filter) + " " + shapeOf(qu.sort)
		if seen[shape] {
			continue
		}
		seen[shape] = true
		cmd := bson.D{{Key: "find", Value: qu.coll}, {Key: "filter", Value: qu.filter}}
		if len(qu.sort) > 0 {
			cmd = append(cmd, bson.E{Key: "sort", Value: qu.sort})
		}
		var out bson.M
		require.NoError(t, b.db.RunCommand(b.ctx, bson.D{{Key: "explain", Value: cmd}, {Key: "verbosity", Value: "queryPlanner"}}).Decode(&out))
		plan, err := json.Marshal(out["queryPlanner"])
		require.NoError(t, err)
		t.Logf("%s\n\tpushdown=%v plan=%s", shape, out["filterPushdown"], plan)
		pushdown, isV1 := out["filterPushdown"]
		v1 = v1 || isV1
		if isV1 {
			// FerretDB v1 (SQLite) filters in SQL only a lone _id equal
			// to a string or an ObjectID (filterPushdown), and decodes and
			// filters every document for any other filter, whatever the
			// indexes: a lookup by one id must take that path; the others
			// are logged above.
			elems, _ := qu.filter.Elements()
			if len(elems) == 1 && elems[0].Key() == "_id" && elems[0].Value().Type != bson.TypeEmbeddedDocument {
				require.Equal(t, true, pushdown, "%s scans its collection", shape)
				byID++
			}
		} else {
			for _, scan := range []string{"COLLSCAN", "Seq Scan"} {
				require.NotContains(t, string(plan), scan, "%s scans its collection", shape)
			}
			require.Contains(t, string(plan), "Index", "%s uses no index", shape)
		}
	}
	require.NotEmpty(t, seen)
	if v1 {
		require.NotZero(t, byID, "no lookup by one id was seen")
	}
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
