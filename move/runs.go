package move

import (
	"context"
	"errors"
	"math"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/internal/canon"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/versioned"
)

// queued is a plain move at the head of a run of relay jobs, as its
// source's pending entry records it.
type queued struct {
	job     *deferred.Job
	a       relayArgs
	debited time.Time
	d       bson.RawValue // S.d.m, once F applied
}

// runMany is the relay's run function (DESIGN.md, "Runs of moves into one
// target"): the plain moves at the head of a run of jobs of one target
// are credited in one statement (B), fenced on the run's first job and
// stamped with its last; then each is finished (F) and forgotten (U) on
// its source, their outcomes recorded in one command (O) and their markers
// removed in one statement (K). Whatever it cannot take whole goes one job
// at a time through run: a saga's step, a move already credited or
// refused, a run of one, a credit the target does not admit.
func (m *Mover) runMany(ctx context.Context, jobs []*deferred.Job) (int, error) {
	if !m.runs {
		return 0, deferred.ErrOneByOne
	}
	moves, err := m.pendingHead(ctx, jobs)
	if err != nil || len(moves) < 2 {
		if err == nil {
			err = deferred.ErrOneByOne
		}
		return 0, err
	}
	to := moves[0].a.To
	absent := make(bson.D, 0, len(moves))
	marks := make(bson.D, 0, len(moves))
	run := make([]*deferred.Job, len(moves))
	var sum int64
	now := time.Now()
	for i, q := range moves {
		run[i] = q.job
		sum += q.a.V
		absent = append(absent, bson.E{Key: m.path("i", q.a.M), Value: bson.D{{Key: "$exists", Value: false}}})
		marks = append(marks, bson.E{Key: m.path("i", q.a.M), Value: bson.D{
			{Key: "v", Value: q.a.V}, {Key: "from", Value: q.a.From}, {Key: "at", Value: now},
		}})
	}
	_, err = deferred.GuardedRun(ctx, run, m.repo, to, m.admits(absent, sum), bson.D{
		{Key: "$inc", Value: bson.D{{Key: m.field, Value: sum}, {Key: m.state + ".n", Value: int64(len(moves))}}},
		{Key: "$set", Value: marks},
	})
	switch {
	case errors.Is(err, deferred.ErrOneByOne) || errors.Is(err, versioned.ErrGuardFailed) || errors.Is(err, versioned.ErrNotFound):
		// A marker there already, a target that refuses one of the
		// credits, or none at all: nothing was written. Or the fence: a
		// job of the run was applied (this run's own B, whose reply was
		// lost, among them), and B's markers are there. Either way each
		// move decides alone (decide reads the marker C finds).
		return 0, deferred.ErrOneByOne
	case err != nil:
		return 0, err
	}
	// B landed: every move of the run is credited (Lemma 1), and the
	// target's stamp is the run's last (Lemma 2): what follows is plain.
	// An error from here fails the run's first job; the next attempt finds
	// the finished moves without their entries and the others credited.
	for i := range moves {
		q := &moves[i]
		landed, err := m.finish(ctx, q.a, Done)
		if err != nil {
			return 0, err
		}
		if landed == nil {
			continue // no entry left to finish: settled alone below
		}
		m.event(ctx, observe.MoveDone, "relay", q.a, time.Since(q.debited))
		q.d, _ = m.entry(landed, "d", q.a.M)
	}
	if err := m.recordAll(ctx, moves); err != nil {
		return 0, err
	}
	var settled []relayArgs
	for _, q := range moves {
		if q.d.Type == 0 {
			src, err := m.readRaw(ctx, q.a.From)
			if err != nil {
				return 0, err
			}
			if err := m.wrapUp(ctx, q.job, q.a, src, true); err != nil {
				return 0, err
			}
			continue
		}
		if err := m.forget(ctx, q.a); err != nil {
			return 0, err
		}
		settled = append(settled, q.a)
	}
	if err := m.cleanAll(ctx, to, settled); err != nil {
		return 0, err
	}
	if len(moves) < len(jobs) {
		return len(moves), deferred.ErrOneByOne
	}
	return len(moves), nil
}

// pendingHead returns the longest head of the run jobs that B may credit
// together: plain moves (no saga) whose pending entry a majority read of
// their sources shows, each once, whose amounts add up within int64.
func (m *Mover) pendingHead(ctx context.Context, jobs []*deferred.Job) ([]queued, error) {
	args := make([]relayArgs, 0, len(jobs))
	ids := make(bson.A, 0, len(jobs))
	for _, job := range jobs {
		var a relayArgs
		if job.Args.Unmarshal(&a) != nil {
			break
		}
		args = append(args, a)
		ids = append(ids, a.From)
	}
	if len(args) < 2 {
		return nil, nil
	}
	sources := map[string]bson.Raw{}
	err := m.majority.Read(ctx, func(c *mongo.Collection) error {
		cur, err := c.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: ids}}}})
		if err != nil {
			return err
		}
		defer func() { _ = cur.Close(ctx) }()
		for cur.Next(ctx) {
			doc := append(bson.Raw(nil), cur.Current...)
			sources[idKey(doc.Lookup("_id"))] = doc
		}
		return cur.Err()
	})
	if err != nil {
		return nil, err
	}
	seen := map[bson.ObjectID]bool{}
	moves := make([]queued, 0, len(args))
	var sum int64
	for i, a := range args {
		src := sources[idKey(a.From)]
		if src == nil || seen[a.M] {
			break
		}
		o, ok := m.entry(src, "o", a.M)
		if !ok {
			break
		}
		d, ok := o.DocumentOK()
		if !ok {
			break
		}
		v, ok := d.Lookup("v").AsInt64OK()
		if _, saga := d.Lookup("g").ObjectIDOK(); saga || !ok || v <= 0 || sum > math.MaxInt64-v {
			break
		}
		a.V, sum, seen[a.M] = v, sum+v, true
		debited, _ := d.Lookup("at").TimeOK()
		moves = append(moves, queued{job: jobs[i], a: a, debited: debited})
	}
	return moves, nil
}

// idKey is an id as a map key, in the form the server matches it by.
func idKey(v bson.RawValue) string {
	c := canon.ID(v)
	return string(rune(c.Type)) + string(c.Value)
}

// recordAll is O for the moves F finished in this run: their outcome
// records, in one unordered command of upserts.
func (m *Mover) recordAll(ctx context.Context, moves []queued) error {
	models := make([]mongo.WriteModel, 0, len(moves))
	for _, q := range moves {
		if q.d.Type == 0 {
			continue
		}
		filter, update, err := m.outcomeRecord(q.a, q.d)
		if err != nil {
			return err
		}
		models = append(models, mongo.NewUpdateOneModel().SetFilter(filter).SetUpdate(update).SetUpsert(true))
	}
	if len(models) == 0 {
		return nil
	}
	_, err := m.outcomes.BulkWrite(ctx, models, options.BulkWrite().SetOrdered(false))
	if err == nil {
		return nil
	}
	// Two upserts of one record at once (a duplicate job's O) make one of
	// them fail on the key; any other error fails the attempt. Whichever,
	// each record is sent alone.
	for _, q := range moves {
		if q.d.Type == 0 {
			continue
		}
		if err := m.recordOne(ctx, q.a, q.d); err != nil {
			return err
		}
	}
	return nil
}

// cleanAll is K for the settled moves of a run: their markers leave the
// target to in one statement, conditioned on every one of them there, and
// one by one (each conditioned on its own) if some is gone already. It is
// plain: the run's B set the target's stamp to the run's last job.
func (m *Mover) cleanAll(ctx context.Context, to bson.RawValue, settled []relayArgs) error {
	if len(settled) == 0 {
		return nil
	}
	present := make(bson.D, 0, len(settled))
	unset := make(bson.D, 0, len(settled))
	for _, a := range settled {
		present = append(present, bson.E{Key: m.path("i", a.M), Value: bson.D{{Key: "$exists", Value: true}}})
		unset = append(unset, bson.E{Key: m.path("i", a.M), Value: ""})
	}
	_, err := m.repo.Guarded(ctx, to, present, bson.D{
		{Key: "$unset", Value: unset},
		{Key: "$inc", Value: bson.D{{Key: m.state + ".n", Value: -int64(len(settled))}}},
	})
	switch {
	case errors.Is(err, versioned.ErrNotFound):
		return nil
	case errors.Is(err, versioned.ErrGuardFailed):
		for _, a := range settled {
			if err := m.unmarkPlain(ctx, a); err != nil {
				return err
			}
		}
		return nil
	}
	return err
}

// staticAccept reports whether accept says the same of a target before and
// after a credit: it names none of the fields a credit writes (the value,
// the state field, the version, versioned's metadata; nor any field whose
// name begins with "_" but _id, where deferred's stamps and such
// bookkeeping live), nor holds an operator that can read any field ($expr,
// $where, $function, $jsonSchema). A run's credits are then checked once,
// together (B); otherwise each alone, on the document the one before it
// left.
func staticAccept(accept bson.D, written ...string) bool {
	if accept == nil {
		return true
	}
	raw, err := bson.Marshal(accept)
	if err != nil {
		return false
	}
	return staticDoc(raw, written)
}

func staticDoc(doc bson.Raw, written []string) bool {
	elems, err := doc.Elements()
	if err != nil {
		return false
	}
	for _, e := range elems {
		k := e.Key()
		switch {
		case k == "$expr" || k == "$where" || k == "$function" || k == "$jsonSchema":
			return false
		case strings.HasPrefix(k, "_") && k != "_id" && !strings.HasPrefix(k, "_id."):
			return false
		}
		for _, w := range written {
			if k == w || strings.HasPrefix(k, w+".") {
				return false
			}
		}
		v := e.Value()
		if sub, ok := v.DocumentOK(); ok && !staticDoc(sub, written) {
			return false
		}
		if arr, ok := v.ArrayOK(); ok && !staticDoc(bson.Raw(arr), written) {
			return false
		}
	}
	return true
}
