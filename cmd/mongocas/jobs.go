package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/deferred"
)

// jobRow is a job as the tables show it, read raw from the jobs collection.
type jobRow struct {
	ID         bson.ObjectID           `bson:"_id"                json:"id"`
	Key        bson.RawValue           `bson:"k"                  json:"-"`
	KeyText    string                  `bson:"-"                  json:"key"`
	Name       string                  `bson:"name"               json:"kind"`
	State      string                  `bson:"state"              json:"state"`
	Attempt    int                     `bson:"attempt"            json:"attempt"`
	Max        int                     `bson:"max"                json:"maxAttempts"`
	EnqueuedAt time.Time               `bson:"enqueued"           json:"enqueuedAt"`
	FinishedAt time.Time               `bson:"finished,omitempty" json:"finishedAt,omitzero"`
	Errors     []deferred.AttemptError `bson:"errors,omitempty"   json:"errors,omitempty"`
	MayApplied bool                    `bson:"mw,omitempty"       json:"mayHaveApplied,omitempty"`
}

func (j *jobRow) lastError() string {
	if len(j.Errors) == 0 {
		return ""
	}
	e := j.Errors[len(j.Errors)-1].Error
	if i := strings.IndexByte(e, '\n'); i >= 0 {
		e = e[:i]
	}
	if len(e) > 100 {
		e = e[:97] + "..."
	}
	return e
}

type jobsReport struct {
	Collection string           `json:"collection"`
	Counts     map[string]int64 `json:"counts"`
	Kinds      []kindCount      `json:"kinds"`
	OldestAge  *float64         `json:"oldestAvailableAgeSeconds"`
	OldestID   string           `json:"oldestAvailableId,omitempty"`
	Dead       []jobRow         `json:"dead"`
}

type kindCount struct {
	Kind   string           `json:"kind"`
	Counts map[string]int64 `json:"counts"`
}

var allStates = []deferred.State{deferred.StateAvailable, deferred.StateRunning, deferred.StateRetryable,
	deferred.StateCompleted, deferred.StateDead, deferred.StateCancelled}

func (c *cli) jobs(ctx context.Context, args []string) error {
	fs := c.flags("jobs")
	jobsColl := fs.String("jobs", "", "the deferred jobs collection")
	limit := fs.Int("limit", 20, "how many dead jobs to list")
	state := fs.String("state", "", "requeue/cancel: the jobs in this state")
	kind := fs.String("kind", "", "requeue/cancel: the jobs of this kind (handler name)")
	key := fs.String("key", "", "requeue/cancel: the jobs of this key")
	dry := fs.Bool("dry-run", false, "requeue/cancel: show what would change, change nothing")
	yes := fs.Bool("yes", false, "requeue/cancel: do not ask")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if *jobsColl == "" {
		return usageErr("name the jobs collection with --jobs (the collection given to deferred.New)")
	}
	action := ""
	if len(pos) > 0 {
		action, pos = pos[0], pos[1:]
	}
	switch action {
	case "", "show", "requeue", "cancel":
	default:
		return usageErr("jobs: unknown action %q: want show, requeue or cancel", action)
	}
	k, ctx, done, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	q, err := deferred.New(k.db.Collection(*jobsColl), nil)
	if err != nil {
		return usageErr("--jobs %q: %v", *jobsColl, err)
	}
	switch action {
	case "show":
		return c.jobShow(ctx, q, pos)
	case "requeue", "cancel":
		return c.jobsChange(ctx, q, action, pos, *state, *kind, *key, *dry, *yes)
	}
	if len(pos) > 0 {
		return usageErr("jobs: unexpected arguments %q", pos)
	}
	return c.jobsSummary(ctx, q, *limit)
}

func (c *cli) jobsSummary(ctx context.Context, q *deferred.Queue, limit int) error {
	counts, err := q.Counts(ctx)
	if err != nil {
		return fail(fmt.Errorf("count the jobs of %s (deferred.Queue.Counts): %w", q.Jobs().Name(), err), "check the collection name and the user's read access")
	}
	r := jobsReport{Collection: q.Jobs().Name(), Counts: map[string]int64{}, Dead: []jobRow{}, Kinds: []kindCount{}}
	for s, n := range counts {
		r.Counts[string(s)] = n
	}
	cur, err := q.Jobs().Aggregate(ctx, bson.A{
		bson.D{{Key: "$match", Value: bson.D{{Key: "name", Value: bson.D{{Key: "$exists", Value: true}}}}}},
		bson.D{{Key: "$group", Value: bson.D{
			{Key: "_id", Value: bson.D{{Key: "name", Value: "$name"}, {Key: "state", Value: "$state"}}},
			{Key: "n", Value: bson.D{{Key: "$sum", Value: 1}}},
		}}},
	})
	if err != nil {
		return fail(fmt.Errorf("count the jobs per kind: %w", err), "check the user's read access")
	}
	var groups []struct {
		ID struct {
			Name  string `bson:"name"`
			State string `bson:"state"`
		} `bson:"_id"`
		N int64 `bson:"n"`
	}
	if err := cur.All(ctx, &groups); err != nil {
		return fail(fmt.Errorf("count the jobs per kind: %w", err), "")
	}
	byKind := map[string]map[string]int64{}
	var kinds []string
	for _, g := range groups {
		if byKind[g.ID.Name] == nil {
			byKind[g.ID.Name] = map[string]int64{}
			kinds = append(kinds, g.ID.Name)
		}
		byKind[g.ID.Name][g.ID.State] += g.N
	}
	slices.Sort(kinds)
	for _, kd := range kinds {
		r.Kinds = append(r.Kinds, kindCount{Kind: kd, Counts: byKind[kd]})
	}
	var oldest jobRow
	err = q.Jobs().FindOne(ctx, bson.D{{Key: "state", Value: string(deferred.StateAvailable)}},
		options.FindOne().SetSort(bson.D{{Key: "enqueued", Value: 1}})).Decode(&oldest)
	if err == nil {
		age := time.Since(oldest.EnqueuedAt).Seconds()
		r.OldestAge, r.OldestID = &age, oldest.ID.Hex()
	}
	cur, err = q.Jobs().Find(ctx, bson.D{{Key: "state", Value: string(deferred.StateDead)}},
		options.Find().SetSort(bson.D{{Key: "finished", Value: -1}}).SetLimit(int64(limit)))
	if err != nil {
		return fail(fmt.Errorf("list the dead jobs: %w", err), "")
	}
	if err := cur.All(ctx, &r.Dead); err != nil {
		return fail(fmt.Errorf("list the dead jobs: %w", err), "")
	}
	for i := range r.Dead {
		r.Dead[i].KeyText = showValue(r.Dead[i].Key)
	}
	if c.json {
		return c.printJSON(r)
	}
	tw := c.table()
	fmt.Fprint(tw, "KIND")
	for _, s := range allStates {
		fmt.Fprintf(tw, "\t%s", strings.ToUpper(string(s)))
	}
	fmt.Fprintln(tw)
	fmt.Fprint(tw, "(all)")
	for _, s := range allStates {
		fmt.Fprintf(tw, "\t%d", r.Counts[string(s)])
	}
	fmt.Fprintln(tw)
	for _, kc := range r.Kinds {
		fmt.Fprint(tw, kc.Kind)
		for _, s := range allStates {
			fmt.Fprintf(tw, "\t%d", kc.Counts[string(s)])
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	fmt.Fprintln(c.out)
	if r.OldestAge != nil {
		fmt.Fprintf(c.out, "oldest available job: %s, enqueued %s ago\n", r.OldestID, short(time.Duration(*r.OldestAge*float64(time.Second))))
	} else {
		fmt.Fprintln(c.out, "oldest available job: none")
	}
	if len(r.Dead) == 0 {
		fmt.Fprintln(c.out, "dead jobs: none")
		return nil
	}
	fmt.Fprintf(c.out, "dead jobs (newest first, at most %d; mongocas jobs show ID for every error):\n", limit)
	tw = c.table()
	fmt.Fprintln(tw, "ID\tKIND\tKEY\tATTEMPTS\tFINISHED\tLAST ERROR")
	for _, j := range r.Dead {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\n", j.ID.Hex(), j.Name, j.KeyText, j.Attempt, j.Max,
			j.FinishedAt.UTC().Format(time.RFC3339), j.lastError())
	}
	return tw.Flush()
}

func (c *cli) jobShow(ctx context.Context, q *deferred.Queue, pos []string) error {
	if len(pos) != 1 {
		return usageErr("jobs show takes one job id")
	}
	id, err := bson.ObjectIDFromHex(pos[0])
	if err != nil {
		return usageErr("%q is not a job id (24 hex digits)", pos[0])
	}
	j, err := q.Job(ctx, id)
	if errors.Is(err, deferred.ErrNotFound) {
		return &cliError{err: err, fix: "check the id and --jobs; completed and cancelled jobs are deleted after their retention", code: exitProblem}
	}
	if err != nil {
		return fail(fmt.Errorf("read job %s (deferred.Queue.Job): %w", id.Hex(), err), "")
	}
	row := jobRow{ID: j.ID, KeyText: showValue(j.Key), Name: j.Name, State: string(j.State), Attempt: j.Attempt,
		Max: j.MaxAttempts, EnqueuedAt: j.EnqueuedAt, FinishedAt: j.FinishedAt, Errors: j.Errors, MayApplied: j.MayHaveApplied}
	if c.json {
		return c.printJSON(row)
	}
	tw := c.table()
	fmt.Fprintf(tw, "id\t%s\nkind\t%s\nkey\t%s\nstate\t%s\nattempts\t%d of %d\nenqueued\t%s\n", row.ID.Hex(), row.Name,
		row.KeyText, row.State, row.Attempt, row.Max, row.EnqueuedAt.UTC().Format(time.RFC3339))
	if !row.FinishedAt.IsZero() {
		fmt.Fprintf(tw, "finished\t%s\n", row.FinishedAt.UTC().Format(time.RFC3339))
	}
	fmt.Fprintf(tw, "may have applied\t%s\n", yesNo(row.MayApplied))
	_ = tw.Flush()
	for _, e := range row.Errors {
		fmt.Fprintf(c.out, "attempt %d at %s: %s\n", e.Attempt, e.At.UTC().Format(time.RFC3339), e.Error)
	}
	return nil
}

type changeResult struct {
	ID     string `json:"id"`
	Kind   string `json:"kind"`
	Key    string `json:"key"`
	State  string `json:"state"`
	Result string `json:"result"` // "would", "done", or the error
}

func (c *cli) jobsChange(ctx context.Context, q *deferred.Queue, action string, ids []string,
	state, kind, key string, dry, yes bool) error {
	var targets []jobRow
	if len(ids) > 0 {
		if state != "" || kind != "" || key != "" {
			return usageErr("jobs %s: give ids or a filter (--state, --kind, --key), not both", action)
		}
		for _, s := range ids {
			id, err := bson.ObjectIDFromHex(s)
			if err != nil {
				return usageErr("%q is not a job id (24 hex digits)", s)
			}
			var j jobRow
			err = q.Jobs().FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&j)
			if err != nil {
				return &cliError{err: fmt.Errorf("read job %s: %w", s, err), fix: "check the id and --jobs; nothing was changed", code: exitProblem}
			}
			targets = append(targets, j)
		}
	} else {
		if state == "" && kind == "" && key == "" {
			return usageErr("jobs %s: name the jobs by id, or by --state, --kind and --key", action)
		}
		filter := bson.D{{Key: "name", Value: bson.D{{Key: "$exists", Value: true}}}}
		switch {
		case state != "":
			filter = append(filter, bson.E{Key: "state", Value: state})
		case action == "requeue":
			filter = append(filter, bson.E{Key: "state", Value: string(deferred.StateDead)})
		default:
			filter = append(filter, bson.E{Key: "state", Value: bson.D{{Key: "$in", Value: bson.A{
				string(deferred.StateAvailable), string(deferred.StateRetryable), string(deferred.StateDead)}}}})
		}
		if kind != "" {
			filter = append(filter, bson.E{Key: "name", Value: kind})
		}
		if key != "" {
			kv, err := parseID(key)
			if err != nil {
				return err
			}
			filter = append(filter, bson.E{Key: "k", Value: bson.D{{Key: "$eq", Value: kv}}})
		}
		cur, err := q.Jobs().Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "p", Value: 1}}))
		if err != nil {
			return fail(fmt.Errorf("find the jobs: %w", err), "")
		}
		if err := cur.All(ctx, &targets); err != nil {
			return fail(fmt.Errorf("find the jobs: %w", err), "")
		}
	}
	results := make([]changeResult, len(targets))
	for i, j := range targets {
		results[i] = changeResult{ID: j.ID.Hex(), Kind: j.Name, Key: showValue(j.Key), State: j.State, Result: "would " + action}
	}
	report := func(verb string) error {
		if c.json {
			return c.printJSON(map[string]any{"action": action, "dryRun": dry, "jobs": results})
		}
		tw := c.table()
		fmt.Fprintln(tw, "ID\tKIND\tKEY\tSTATE\tRESULT")
		for _, r := range results {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.ID, r.Kind, r.Key, r.State, r.Result)
		}
		_ = tw.Flush()
		fmt.Fprintln(c.out, verb)
		return nil
	}
	if len(targets) == 0 {
		c.status = exitProblem
		return report("no job matches: nothing was changed")
	}
	if dry {
		return report(fmt.Sprintf("dry run: would %s %d jobs; nothing was changed", action, len(targets)))
	}
	if !yes {
		if !c.json {
			_ = report("")
		}
		if !c.confirm(fmt.Sprintf("%s these %d jobs?", action, len(targets))) {
			return notConfirmed()
		}
	}
	done := 0
	for i, j := range targets {
		var err error
		if action == "requeue" {
			err = q.Requeue(ctx, j.ID)
		} else {
			err = q.Cancel(ctx, j.ID)
		}
		if err != nil {
			results[i].Result = err.Error()
			continue
		}
		done++
		results[i].Result = action + "d"
		if action == "cancel" {
			results[i].Result = "cancelled"
		}
	}
	if done < len(targets) {
		c.status = exitProblem
	}
	return report(fmt.Sprintf("%s: %d of %d jobs", action, done, len(targets)))
}
