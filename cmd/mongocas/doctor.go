package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/store"
)

type doctorReport struct {
	URI          string        `json:"uri"`
	Database     string        `json:"database"`
	Server       string        `json:"server"`
	Version      string        `json:"version"`
	Topology     string        `json:"topology"`
	Capabilities []capability  `json:"capabilities"`
	LeaseMode    string        `json:"leaseMode"`
	LeaseWhy     string        `json:"leaseModeWhy"`
	Clock        *clockReport  `json:"clock,omitempty"`
	ClockError   string        `json:"clockError,omitempty"`
	Indexes      []indexReport `json:"indexes,omitempty"`
	Problems     []problem     `json:"problems"`
}

type capability struct {
	Name    string `json:"name"`
	Present bool   `json:"present"`
	Meaning string `json:"meaning"`
}

type clockReport struct {
	OffsetMS float64 `json:"offsetMs"` // server minus this host
	BoundMS  float64 `json:"boundMs"`
	RTTMS    float64 `json:"rttMs"`
}

type indexReport struct {
	Package    string `json:"package"`
	Collection string `json:"collection"`
	Keys       string `json:"keys"`
	Purpose    string `json:"purpose"`
	Needed     bool   `json:"needed"` // false: not made on this server (the package sweeps instead)
	Present    bool   `json:"present"`
	Fixed      bool   `json:"fixed,omitempty"`
}

type problem struct {
	What string `json:"what"`
	Fix  string `json:"fix"`
}

// capabilityLines are the capability lines doctor prints, from Probe's answer.
func capabilityLines(caps store.Capabilities) []capability {
	line := func(name string, present bool, yes, no string) capability {
		if present {
			return capability{name, present, yes}
		}
		return capability{name, present, no}
	}
	return []capability{
		line("transactions", caps.Transactions, "deferred's Enqueue can join a caller's transaction (outbox)",
			"no outbox: Enqueue cannot join a caller's transaction"),
		line("retryable writes", caps.RetryableWrites, "the driver retries a write once after a network error",
			"a lost reply reaches the packages, which re-read to settle it"),
		line("$expr/$$NOW in writes", caps.Expr, "lease can judge expiry on the server's clock (ModeServer)",
			"lease judges expiry on an estimate of the server's clock (ModeEstimated)"),
		line("$$NOW in update pipelines", caps.UpdatePipelines, "leases set expiry from the server's clock",
			"leases set expiry from the clock estimate"),
		line("TTL indexes", caps.TTLIndexes, "the server deletes old jobs and key records",
			"nothing expires by itself: the packages' Sweep deletes old records"),
	}
}

func (c *cli) doctor(ctx context.Context, args []string) error {
	fs := c.flags("doctor")
	jobs := fs.String("jobs", "", "a deferred jobs collection to check")
	leases := fs.String("leases", "", "a named-lease lock collection to check")
	keys := fs.String("keys", "", "an idempotency keys collection to check")
	field := fs.String("field", "_lease", "the lease field of the lock collection")
	fix := fs.Bool("fix", false, "create the missing indexes through the packages' EnsureIndexes")
	if pos, err := c.parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usageErr("doctor takes no arguments, got %q", pos)
	}
	k, ctx, done, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer done()

	caps, err := store.Probe(ctx, k.db)
	if err != nil {
		return fail(fmt.Errorf("probe the server (store.Probe on %s): %w", k.db.Name(), err),
			"the user needs read and write access to the database (Probe writes scratch documents to "+store.ProbeCollection+" and deletes them)")
	}
	r := doctorReport{
		URI: store.RedactURI(c.uri), Database: k.db.Name(),
		Server: string(caps.Server), Version: caps.Version, Topology: string(caps.Topology),
		Capabilities: capabilityLines(caps), Problems: []problem{},
	}

	// The lease mode, as lease's ModeAuto finds it by trying.
	// Its scratch collection is its own, dropped afterwards, like store.Probe's.
	probe := k.db.Collection(store.ProbeCollection + "_lease_" + bson.NewObjectID().Hex())
	defer func() { _ = probe.Drop(context.WithoutCancel(ctx)) }()
	m, err := lease.NewNamed(probe, &lease.Options{TTL: 30 * time.Second})
	if err == nil {
		var mode lease.Mode
		if mode, err = m.Mode(ctx); err == nil {
			r.LeaseMode = mode.String()
			if mode == lease.ModeServer {
				r.LeaseWhy = "the server runs $expr with $$NOW in a write filter and $$NOW in an update pipeline: " +
					"expiry is judged by the server's own clock, no estimate"
			} else {
				r.LeaseWhy = "the server lacks $expr/$$NOW in writes: expiry is judged on an estimate of the " +
					"server's clock (hello's localTime), within the bound below"
			}
		}
	}
	if err != nil {
		r.LeaseMode = "unknown"
		r.LeaseWhy = err.Error()
		r.Problems = append(r.Problems, problem{"lease could not find its mode: " + err.Error(),
			"check the user's write access to " + probe.Name()})
	}

	clock := store.NewServerClock(store.HelloSampler(k.st.Client()), nil)
	est, err := clock.Now(ctx)
	local := time.Now()
	if err != nil {
		r.ClockError = err.Error()
		if r.LeaseMode != lease.ModeServer.String() {
			r.Problems = append(r.Problems, problem{"no reading of the server's clock: " + err.Error(),
				"leases in ModeEstimated need hello's localTime; check the server answers hello"})
		}
	} else {
		off := est.Time.Sub(local)
		r.Clock = &clockReport{OffsetMS: ms(off), BoundMS: ms(est.Bound), RTTMS: ms(est.RTT)}
	}

	// check records whether an index is there before any is created, so
	// that --fix reports every index it created as created, those made by
	// one EnsureIndexes call for an earlier line included; fixAll then
	// creates what is missing.
	type fixer struct {
		report int // index into r.Indexes
		want   bson.D
		ensure func() error
	}
	var fixers []fixer
	check := func(pkg, coll, purpose string, needed bool, want bson.D, ensure func() error) error {
		present, err := hasIndex(ctx, k.db.Collection(coll), want)
		if err != nil {
			return fail(fmt.Errorf("list the indexes of %s: %w", coll, err), "the user needs the listIndexes privilege on the database")
		}
		r.Indexes = append(r.Indexes, indexReport{Package: pkg, Collection: coll, Keys: keyString(want), Purpose: purpose, Needed: needed, Present: present})
		fixers = append(fixers, fixer{len(r.Indexes) - 1, want, ensure})
		return nil
	}
	fixAll := func() error {
		ensured := map[string]bool{} // by package and collection: one EnsureIndexes call each
		for _, f := range fixers {
			ir := &r.Indexes[f.report]
			if ir.Needed && !ir.Present && *fix {
				if group := ir.Package + " " + ir.Collection; !ensured[group] {
					ensured[group] = true
					if err := f.ensure(); err != nil {
						return fail(fmt.Errorf("create the indexes of %s (%s): %w", ir.Collection, ir.Package, err), "the user needs the createIndex privilege")
					}
				}
				present, err := hasIndex(ctx, k.db.Collection(ir.Collection), f.want)
				if err != nil {
					return err
				}
				ir.Present, ir.Fixed = present, present
			}
			if ir.Needed && !ir.Present {
				r.Problems = append(r.Problems, problem{
					fmt.Sprintf("%s: index %s on %s is missing (%s)", ir.Package, ir.Keys, ir.Collection, ir.Purpose),
					fmt.Sprintf("run mongocas doctor --fix with the same flags, or call the package's EnsureIndexes at start-up (%s)", ensureName(ir.Package)),
				})
			}
		}
		return nil
	}
	if *jobs != "" {
		q, err := deferred.New(k.db.Collection(*jobs), nil)
		if err != nil {
			return usageErr("--jobs %q: %v", *jobs, err)
		}
		ensure := func() error { _, err := q.EnsureIndexes(ctx); return err }
		keysColl := q.Keys().Name()
		for _, ix := range []struct {
			coll    string
			keys    bson.D
			purpose string
			needed  bool
		}{
			{*jobs, bson.D{{Key: "p", Value: 1}}, "unique: one job per place (key and sequence number)", true},
			{*jobs, bson.D{{Key: "state", Value: 1}}, "Counts", true},
			{*jobs, bson.D{{Key: "expireAt", Value: 1}}, ttlPurpose(caps.TTLIndexes, "completed jobs"), true},
			{keysColl, bson.D{{Key: "n", Value: 1}, {Key: "t", Value: 1}}, "the workers' search for keys with work", true},
		} {
			if err := check("deferred", ix.coll, ix.purpose, ix.needed, ix.keys, ensure); err != nil {
				return err
			}
		}
	}
	if *leases != "" {
		m, err := lease.NewNamed(k.db.Collection(*leases), &lease.Options{TTL: 30 * time.Second, Field: *field})
		if err != nil {
			return usageErr("--leases %q: %v", *leases, err)
		}
		// lease.EnsureIndexes makes the TTL index where the probe found TTL indexes.
		needed := caps.TTLIndexes
		purpose := "TTL: deletes stale lock documents"
		if !needed {
			purpose = "not made on " + string(caps.Server) + ": call Manager.Sweep instead"
		}
		ensure := func() error { _, err := m.EnsureIndexes(ctx); return err }
		if err := check("lease", *leases, purpose, needed, bson.D{{Key: *field + ".expiresAt", Value: 1}}, ensure); err != nil {
			return err
		}
	}
	if *keys != "" {
		ks, err := idempotency.New(k.db.Collection(*keys), nil)
		if err != nil {
			return usageErr("--keys %q: %v", *keys, err)
		}
		purpose := "TTL: deletes records after Retention"
		if !caps.TTLIndexes {
			purpose = "not made without TTL indexes: call Keys.Sweep instead"
		}
		ensure := func() error { _, err := ks.EnsureIndexes(ctx); return err }
		if err := check("idempotency", *keys, purpose, caps.TTLIndexes, bson.D{{Key: "expireAt", Value: 1}}, ensure); err != nil {
			return err
		}
	}
	if err := fixAll(); err != nil {
		return err
	}
	if len(r.Problems) > 0 {
		c.status = exitProblem
	}
	if c.json {
		return c.printJSON(r)
	}
	c.printDoctor(r)
	return nil
}

func ttlPurpose(ttl bool, what string) string {
	if ttl {
		return "TTL: deletes " + what + " after Retention"
	}
	return "for Sweep, which deletes " + what + " (no TTL indexes here)"
}

func ensureName(pkg string) string {
	switch pkg {
	case "deferred":
		return "deferred.Queue.EnsureIndexes; Run and the first Enqueue call it too"
	case "lease":
		return "lease.Manager.EnsureIndexes on the NewNamed Manager"
	}
	return "idempotency.Keys.EnsureIndexes"
}

func (c *cli) printDoctor(r doctorReport) {
	tw := c.table()
	fmt.Fprintf(tw, "server\t%s %s\n", r.Server, r.Version)
	fmt.Fprintf(tw, "topology\t%s\n", topologyName(r.Topology))
	fmt.Fprintf(tw, "database\t%s on %s\n", r.Database, r.URI)
	_ = tw.Flush()
	fmt.Fprintln(c.out)
	tw = c.table()
	fmt.Fprintln(tw, "CAPABILITY\tPRESENT\tWHAT IT MEANS HERE")
	for _, cp := range r.Capabilities {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", cp.Name, yesNo(cp.Present), cp.Meaning)
	}
	_ = tw.Flush()
	fmt.Fprintln(c.out)
	tw = c.table()
	fmt.Fprintf(tw, "lease mode\t%s\t%s\n", r.LeaseMode, r.LeaseWhy)
	if r.Clock != nil {
		fmt.Fprintf(tw, "server clock\t%+.1fms\tfrom this host's, within ±%.1fms (round trip %.1fms)\n", r.Clock.OffsetMS, r.Clock.BoundMS, r.Clock.RTTMS)
	} else {
		fmt.Fprintf(tw, "server clock\tunknown\t%s\n", r.ClockError)
	}
	_ = tw.Flush()
	if len(r.Indexes) > 0 {
		fmt.Fprintln(c.out)
		tw = c.table()
		fmt.Fprintln(tw, "PACKAGE\tCOLLECTION\tINDEX\tSTATE\tPURPOSE")
		for _, ix := range r.Indexes {
			state := "present"
			switch {
			case ix.Fixed:
				state = "created"
			case !ix.Present && ix.Needed:
				state = "MISSING"
			case !ix.Present:
				state = "not needed"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", ix.Package, ix.Collection, ix.Keys, state, ix.Purpose)
		}
		_ = tw.Flush()
	}
	fmt.Fprintln(c.out)
	if len(r.Problems) == 0 {
		fmt.Fprintln(c.out, "ok: nothing the chosen packages need is missing")
		return
	}
	for _, p := range r.Problems {
		fmt.Fprintf(c.out, "problem: %s\n  to fix: %s\n", p.What, p.Fix)
	}
}

func topologyName(t string) string {
	switch store.Topology(t) {
	case store.ReplicaSet:
		return "replica set"
	case store.Sharded:
		return "sharded cluster"
	case store.Standalone:
	}
	return t
}

// hasIndex reports whether coll has an index on exactly these keys, in order.
func hasIndex(ctx context.Context, coll *mongo.Collection, want bson.D) (bool, error) {
	cur, err := coll.Indexes().List(ctx)
	if err != nil {
		// A collection that does not exist has no indexes.
		if ce, ok := errors.AsType[mongo.CommandError](err); ok && ce.Code == 26 {
			return false, nil
		}
		return false, err
	}
	var specs []struct {
		Key bson.D `bson:"key"`
	}
	if err := cur.All(ctx, &specs); err != nil {
		return false, err
	}
	wantKeys := make([]string, len(want))
	for i, e := range want {
		wantKeys[i] = e.Key
	}
	for _, s := range specs {
		got := make([]string, len(s.Key))
		for i, e := range s.Key {
			got[i] = e.Key
		}
		if slices.Equal(got, wantKeys) {
			return true, nil
		}
	}
	return false, nil
}

func keyString(d bson.D) string {
	var b strings.Builder
	b.WriteString("{")
	for i, e := range d {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %v", e.Key, e.Value)
	}
	b.WriteString("}")
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
