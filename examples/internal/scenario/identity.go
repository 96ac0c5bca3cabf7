package scenario

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/retry"
)

// Primary identity switch (seeds 000 and 002): a user promotes one of their
// linked identities to primary, which takes two calls to a partner identity
// provider (unlink, then link the other way round) that cannot be made
// atomic. Two switches for the same user at once (a double click, two tabs)
// interleave their calls and leave the partner with two primaries, or with a
// primary the local database does not know.
//
// Strategies:
//
//   - no lock: read the primary, call the partner, $set the new primary.
//   - the program's own service (in examples/identity/main.go: a lease on the
//     user's document around the whole sequence, with lease.Manager.Do).
//     Switches for the same user wait their turn; none interleave. The
//     lease's epoch goes to the partner as the fencing token and in the
//     idempotency key, and the final write is fenced with Lease.Fence. A
//     double click that arrives while a switch runs gets ErrHeld at once,
//     with the time left on the lease (a 409 with Retry-After). After the
//     run, if the service serves the switch over HTTP with idempotency keys
//     (HTTPIdentities), one client per user times out and retries: see
//     RetryResult.
//   - transaction held across the HTTP calls (the anti-pattern of seed 002):
//     the first write of a transaction takes the user's document, and the
//     transaction stays open through the partner calls. It does stop the
//     interleaving, but every other switch for that user spins on write
//     conflicts meanwhile, and the server holds an open transaction and a
//     document lock for as long as the partner takes. Only where the server
//     has transactions.

// PartnerAPI is the partner identity provider's API as a service calls it
// (*PartnerClient is one).
type PartnerAPI interface {
	// SwitchPrimary makes identity the user's primary one over from, its
	// primary now: two calls, each retried on 5xx answers. The calls'
	// idempotency keys start with key; fencingToken, when not 0, is sent
	// for the partner to refuse a token older than one it has seen.
	SwitchPrimary(ctx context.Context, user, from, identity, key string, fencingToken int64) error
}

// Identities is a service that switches users' primary identities: the code
// under test in the identity scenario.
type Identities interface {
	// AddUser stores a user with their identities, the first one primary
	// (the partner knows them already).
	AddUser(ctx context.Context, id string, identities []string) error
	// Switch makes identity the user's primary one, at the partner and in
	// the database, waiting its turn if the strategy serializes switches.
	Switch(ctx context.Context, user, identity string) error
	// SwitchNow is Switch for a request that must not wait, such as a
	// double click: while another switch for the user runs, a mongocas
	// strategy fails at once with a *lease.HeldError.
	SwitchNow(ctx context.Context, user, identity string) error
}

// IdentityStrategy is a way to run the switch.
type IdentityStrategy struct {
	// Name names it in the table.
	Name string
	// Kind is KindNaive, KindMongocas or KindAntiPattern. A mongocas
	// strategy runs as two instances of the service that share the
	// requests, and the first switch of each user to call the partner is
	// double-clicked: the other instance's SwitchNow, which must fail with
	// a *lease.HeldError.
	Kind string
	// Open returns one instance of the service: users is the users
	// collection, partner the partner's client, instance a name unique
	// among the instances that run at once (a lease owner), and leaseTTL
	// the TTL of any lease it takes.
	Open func(users *mongo.Collection, partner PartnerAPI, instance string, leaseTTL time.Duration) (Identities, error)
	// Transactions says the strategy needs multi-document transactions:
	// where the server has none, the run is refused with ErrNoTransactions.
	Transactions bool
}

// String returns the strategy's name.
func (s IdentityStrategy) String() string { return s.Name }

// The harness's own identity strategies.
var (
	// IdentityNoLock calls the partner with no coordination.
	IdentityNoLock = IdentityStrategy{
		Name: "no lock",
		Kind: KindNaive,
		Open: func(users *mongo.Collection, partner PartnerAPI, _ string, _ time.Duration) (Identities, error) {
			return &noLockIdentities{users: users, partner: partner}, nil
		},
	}
	// IdentityTxAcrossHTTP holds a transaction open across the partner calls.
	IdentityTxAcrossHTTP = IdentityStrategy{
		Name: "transaction held across HTTP",
		Kind: KindAntiPattern,
		Open: func(users *mongo.Collection, partner PartnerAPI, _ string, _ time.Duration) (Identities, error) {
			return &txIdentities{users: users, partner: partner}, nil
		},
		Transactions: true,
	}
)

// Identity is the identity scenario: IdentityNoLock, the program's service,
// and IdentityTxAcrossHTTP where the server has transactions.
type Identity struct {
	// Config sizes the run; RegisterFlags binds it to flags.
	Config IdentityConfig
	// Mongocas is the program's service.
	Mongocas IdentityStrategy
}

// Name returns "identity".
func (*Identity) Name() string { return "identity" }

// RegisterFlags registers the scenario's sizes on fs.
func (sc *Identity) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&sc.Config.Users, "users", 12, "identity: users switching their primary identity")
	fs.IntVar(&sc.Config.Switches, "switches", 3, "identity: concurrent switches per user")
	fs.DurationVar(&sc.Config.LatencyMin, "latency-min", 20*time.Millisecond, "identity: partner latency, lower bound")
	fs.DurationVar(&sc.Config.LatencyMax, "latency-max", 80*time.Millisecond, "identity: partner latency, upper bound")
	fs.Float64Var(&sc.Config.FailureRate, "failure-rate", 0.1, "identity: share of partner calls answered 503 (negative: none)")
	fs.DurationVar(&sc.Config.LeaseTTL, "lease-ttl", 5*time.Second, "identity: lease TTL")
}

// Run runs IdentityNoLock, sc.Mongocas and IdentityTxAcrossHTTP.
func (sc *Identity) Run(ctx context.Context, env Env, rep *Report) error {
	cfg := sc.Config
	cfg.Progress = env.Progress
	if env.Seed != 0 {
		cfg.Seed = env.Seed
	}
	return runEach(rep, sc.Name(), ", so the anti-pattern cannot be shown",
		[]IdentityStrategy{IdentityNoLock, sc.Mongocas, IdentityTxAcrossHTTP},
		func(s IdentityStrategy) (*IdentityResult, error) {
			return RunIdentity(ctx, env.DB, s, env.Caps.Transactions, cfg)
		})
}

// IdentityConfig sizes an identity run. Zero fields take their defaults.
type IdentityConfig struct {
	// Users is how many users switch their primary. Default 12.
	Users int
	// Switches is how many switches each user starts at once, each to
	// another identity. Default 3.
	Switches int
	// LatencyMin and LatencyMax bound each partner call's latency. Default
	// 20ms to 80ms.
	LatencyMin, LatencyMax time.Duration
	// FailureRate is the chance that a partner call answers 503 (half of
	// them after applying it); the caller retries with retry.Do. Default
	// 0.1; negative means none.
	FailureRate float64
	// LeaseTTL is the lease's TTL. Default 5s, well above a switch's
	// worst case (two calls, each retried for up to 2s).
	LeaseTTL time.Duration
	// Seed makes the partner's latencies and failures repeatable.
	Seed uint64
	// Progress, if not nil, receives a line now and then during a long run.
	Progress io.Writer
}

func (c IdentityConfig) withDefaults() IdentityConfig {
	if c.Users <= 0 {
		c.Users = 12
	}
	if c.Switches <= 0 {
		c.Switches = 3
	}
	if c.LatencyMin <= 0 && c.LatencyMax <= 0 {
		c.LatencyMin, c.LatencyMax = 20*time.Millisecond, 80*time.Millisecond
	}
	switch {
	case c.FailureRate == 0:
		c.FailureRate = 0.1
	case c.FailureRate < 0:
		c.FailureRate = 0
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 5 * time.Second
	}
	return c
}

// IdentityResult is what an identity run did.
type IdentityResult struct {
	Row
	// Users and Switches are the run's size.
	Users, Switches int
	// Done is how many switches completed; Failed how many ended in an
	// error (the partner refused a call because another switch had changed
	// the identities underneath, or an unexpected error).
	Done, Failed int
	// Partner is what the partner saw: calls, retries it caused, replayed
	// idempotency keys, stale fencing tokens and interleaved sequences.
	Partner PartnerStats
	// PartnerRetries is how many partner calls the callers retried.
	PartnerRetries int64
	// Corrupted is how many users end with other than exactly one primary
	// at the partner, or with a partner primary the database does not hold.
	Corrupted int
	// DoubleClicks is how many double clicks were tried (mongocas only), and
	// DoubleClickHeld how many of them got ErrHeld; DoubleClickTimeLeft is
	// the time left the first one was told.
	DoubleClicks, DoubleClickHeld int
	DoubleClickTimeLeft           time.Duration
	DoubleClickHolder             string
	// TxAttempts is how many transaction attempts the switches made (the
	// transaction strategy only); TxAborted how many of them were aborted by
	// a write conflict and started again.
	TxAttempts, TxAborted int64
	// TxMaxOpen is the most transactions that held a user's document locked
	// across partner calls at once; TxLockHeld the distribution of how long
	// each held it.
	TxMaxOpen  int64
	TxLockHeld Latency
	// Retry is what the timed-out clients saw, for a service that serves
	// the switch over HTTP with idempotency keys (HTTPIdentities); nil
	// otherwise.
	Retry *RetryResult
}

// RunIdentity runs one identity strategy against a fresh fake partner and a
// fresh collection of db. transactions says whether the server has them.
func RunIdentity(ctx context.Context, db *mongo.Database, s IdentityStrategy, transactions bool, cfg IdentityConfig) (*IdentityResult, error) {
	cfg = cfg.withDefaults()
	if s.Open == nil {
		return nil, fmt.Errorf("identity: strategy %q has no Open", s.Name)
	}
	if s.Transactions && !transactions {
		return nil, ErrNoTransactions
	}
	coll := db.Collection("users_" + slug(s.Name))
	if err := coll.Drop(ctx); err != nil {
		return nil, fmt.Errorf("identity: drop: %w", err)
	}
	partner := NewPartner(PartnerConfig{LatencyMin: cfg.LatencyMin, LatencyMax: cfg.LatencyMax, FailureRate: cfg.FailureRate, Seed: cfg.Seed})
	defer partner.Close()
	client := partner.Client(retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 200 * time.Millisecond, MaxAttempts: 10, MaxElapsedTime: 3 * time.Second})
	defer client.Close()

	res := &IdentityResult{Row: Row{Scenario: "identity", Strategy: s.Name, Kind: s.Kind, Requests: cfg.Users * cfg.Switches}, Users: cfg.Users, Switches: cfg.Switches}
	// A mongocas strategy runs as two instances of the service (two
	// processes, say), so that switches for one user compete across
	// instances as well as within one, and is double-clicked.
	var clicks *doubleClicks
	insts := make([]Identities, 1)
	if s.Kind == KindMongocas {
		clicks = &doubleClicks{clicked: map[string]bool{}, res: res}
		insts = make([]Identities, 2)
	}
	for i := range insts {
		var p PartnerAPI = client
		if clicks != nil {
			p = &clickingPartner{PartnerAPI: client, clicks: clicks, other: (i + 1) % len(insts)}
		}
		var err error
		if insts[i], err = s.Open(coll, p, fmt.Sprintf("service-instance-%d", i+1), cfg.LeaseTTL); err != nil {
			return nil, err
		}
	}
	if clicks != nil {
		clicks.insts = insts
	}

	ids := make([]string, cfg.Users)
	identsOf := make(map[string][]string, cfg.Users)
	for u := range ids {
		ids[u] = fmt.Sprintf("user-%02d", u+1)
		idents := make([]string, cfg.Switches+1)
		for k := range idents {
			idents[k] = fmt.Sprintf("%s-id%d", ids[u], k)
		}
		identsOf[ids[u]] = idents
		partner.AddUser(ids[u], idents)
		if err := insts[0].AddUser(ctx, ids[u], idents); err != nil {
			return nil, fmt.Errorf("identity: add user: %w", err)
		}
	}

	warmUp(ctx, db, cfg.Users*cfg.Switches)
	// Request r is user r/Switches switching to identity 1 + r%Switches, on
	// instance r%len(insts).
	type request struct {
		user, target, seq string
	}
	reqs := make([]request, res.Requests)
	for r := range reqs {
		u := r / cfg.Switches
		reqs[r] = request{user: ids[u], target: fmt.Sprintf("%s-id%d", ids[u], 1+r%cfg.Switches), seq: "switch-" + strconv.Itoa(r)}
	}
	outcomes := make([]error, len(reqs))
	var rec recorder
	start := time.Now()
	p := startProgress(cfg.Progress, "identity/"+s.Name, len(reqs))
	forEach(len(reqs), 0, p, func(r int) {
		q := reqs[r]
		rec.time(func() { outcomes[r] = insts[r%len(insts)].Switch(withSequence(ctx, q.seq), q.user, q.target) })
	})
	p.end()
	res.Elapsed, res.Latency = time.Since(start), rec.latency()
	if tx, ok := insts[0].(*txIdentities); ok {
		tx.report(res)
	}

	var firstErr error
	for _, err := range outcomes {
		if err == nil {
			res.Done++
			continue
		}
		res.Failed++
		firstErr = cmp.Or(firstErr, err)
	}
	res.Errors = res.Failed
	res.Partner = partner.Stats()
	res.PartnerRetries = client.Retries()
	for _, id := range ids {
		var u struct {
			Primary string `bson:"primary"`
		}
		if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&u); err != nil {
			return nil, fmt.Errorf("identity: read user: %w", err)
		}
		if prim := partner.Primaries(id); len(prim) != 1 || prim[0] != u.Primary {
			res.Corrupted++
		}
	}
	res.Anomalies = res.Partner.Interleaved + res.Corrupted + (res.DoubleClicks - res.DoubleClickHeld)
	if svc, ok := insts[0].(HTTPIdentities); ok && cfg.Switches >= 2 {
		// After the run: clients that time out and retry, over HTTP with
		// idempotency keys. The first attempt's timeout is below one
		// partner call's latency, and a switch makes two.
		retried, err := runTimedOutClients(ctx, svc, coll, partner, identsOf, max(cfg.LatencyMin, time.Millisecond))
		if err != nil {
			return nil, fmt.Errorf("identity: timed-out clients: %w", err)
		}
		res.Retry = retried
		res.Anomalies += res.Retry.SwitchedTwice
		res.Errors += len(res.Retry.Failures)
	}

	res.Details = append(res.Details,
		fmt.Sprintf("%d users × %d concurrent switches: %d done, %d failed", cfg.Users, cfg.Switches, res.Done, res.Failed),
		fmt.Sprintf("partner: %d calls, %d answered 503 (%d caller retries, %d replies replayed by idempotency key), %d stale fencing tokens refused",
			res.Partner.Calls, res.Partner.Failed, res.PartnerRetries, res.Partner.Replayed, res.Partner.StaleTokens),
		fmt.Sprintf("interleaved unlink/link sequences: %d%s; users left with a corrupted primary: %d",
			res.Partner.Interleaved, plural(res.Partner.InterleavedUsers, " (%d user%s)"), res.Corrupted))
	if clicks != nil {
		line := fmt.Sprintf("double clicks: %d, %d got ErrHeld at once", res.DoubleClicks, res.DoubleClickHeld)
		if res.DoubleClickHeld > 0 {
			line += fmt.Sprintf(" (a 409: held by %s, retry after %v)", res.DoubleClickHolder, res.DoubleClickTimeLeft.Round(time.Millisecond))
		}
		res.Details = append(res.Details, line, "each switch sent its lease epoch to the partner as fencing token and idempotency key")
		res.Details = append(res.Details, clicks.notes...)
	}
	if res.Retry != nil {
		res.Details = append(res.Details, res.Retry.details()...)
	}
	if s.Transactions {
		res.Details = append(res.Details, fmt.Sprintf("up to %d transactions at once held a user's document locked across the partner calls, each for p50 %v, max %v; %d of %d transaction attempts were aborted by write conflicts and retried (the other switches waited)",
			res.TxMaxOpen, res.TxLockHeld.P50.Round(time.Millisecond), res.TxLockHeld.Max.Round(time.Millisecond), res.TxAborted, res.TxAttempts))
	}
	if firstErr != nil {
		res.Details = append(res.Details, fmt.Sprintf("first failure: %v", firstErr))
	}
	return res, nil
}

// doubleClicks double-clicks the first switch of each user to call the
// partner: while that switch holds whatever serializes switches, a second
// request for the same user calls SwitchNow on another instance, which must
// fail at once with a *lease.HeldError.
type doubleClicks struct {
	insts []Identities

	mu      sync.Mutex
	clicked map[string]bool
	res     *IdentityResult
	notes   []string
}

// clickingPartner is the partner client an instance of a mongocas strategy
// gets: before a user's first partner call, it double-clicks on instance
// other.
type clickingPartner struct {
	PartnerAPI
	clicks *doubleClicks
	other  int
}

func (p *clickingPartner) SwitchPrimary(ctx context.Context, user, from, identity, key string, token int64) error {
	p.clicks.mu.Lock()
	first := !p.clicks.clicked[user]
	p.clicks.clicked[user] = true
	p.clicks.mu.Unlock()
	if first {
		p.clicks.click(withSequence(ctx, sequence(ctx)+"/double-click"), p.other, user, identity)
	}
	return p.PartnerAPI.SwitchPrimary(ctx, user, from, identity, key, token)
}

// click makes the double click and counts its answer.
func (d *doubleClicks) click(ctx context.Context, inst int, user, identity string) {
	err := d.insts[inst].SwitchNow(ctx, user, identity)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.res.DoubleClicks++
	var held *lease.HeldError
	switch {
	case errors.As(err, &held):
		d.res.DoubleClickHeld++
		if d.res.DoubleClickTimeLeft == 0 {
			d.res.DoubleClickTimeLeft, d.res.DoubleClickHolder = held.TimeLeft, held.Owner
		}
	case err == nil:
		d.notes = append(d.notes, fmt.Sprintf("double click: it switched %s while another switch was running", user))
	default:
		d.notes = append(d.notes, "double click: "+err.Error())
	}
}

// noLockIdentities switches with no coordination: read the primary, call the
// partner, $set the new primary.
type noLockIdentities struct {
	users   *mongo.Collection
	partner PartnerAPI
}

func (n *noLockIdentities) AddUser(ctx context.Context, id string, identities []string) error {
	return addUserDoc(ctx, n.users, id, identities)
}

func (n *noLockIdentities) Switch(ctx context.Context, user, identity string) error {
	var u struct {
		Primary string `bson:"primary"`
	}
	if err := n.users.FindOne(ctx, bson.D{{Key: "_id", Value: user}}).Decode(&u); err != nil {
		return err
	}
	if err := n.partner.SwitchPrimary(ctx, user, u.Primary, identity, sequence(ctx), 0); err != nil {
		return err
	}
	_, err := n.users.UpdateOne(ctx, bson.D{{Key: "_id", Value: user}}, bson.D{{Key: "$set", Value: bson.D{{Key: "primary", Value: identity}}}})
	return err
}

func (n *noLockIdentities) SwitchNow(ctx context.Context, user, identity string) error {
	return n.Switch(ctx, user, identity)
}

// addUserDoc inserts a user document for the harness's own strategies.
func addUserDoc(ctx context.Context, users *mongo.Collection, id string, identities []string) error {
	_, err := users.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "primary", Value: identities[0]}, {Key: "identities", Value: identities}})
	return err
}

// txIdentities is the anti-pattern: the switch runs inside a transaction
// whose first write takes the user's document, and the partner calls happen
// while it is open. It counts what that costs.
type txIdentities struct {
	users   *mongo.Collection
	partner PartnerAPI

	open, maxOpen, attempts, switches atomic.Int64
	held                              recorder
}

func (t *txIdentities) AddUser(ctx context.Context, id string, identities []string) error {
	return addUserDoc(ctx, t.users, id, identities)
}

func (t *txIdentities) SwitchNow(ctx context.Context, user, identity string) error {
	return t.Switch(ctx, user, identity)
}

func (t *txIdentities) Switch(ctx context.Context, user, identity string) error {
	t.switches.Add(1)
	sess, err := t.users.Database().Client().StartSession()
	if err != nil {
		return err
	}
	defer sess.EndSession(context.WithoutCancel(ctx))
	var lockedAt time.Time
	locked := false
	_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
		t.attempts.Add(1)
		if locked { // a retry of a transaction that had the lock
			t.open.Add(-1)
			locked = false
		}
		// The first write takes the document: any other transaction
		// writing it now fails with a write conflict and starts over.
		if _, err := t.users.UpdateOne(ctx, bson.D{{Key: "_id", Value: user}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "switches", Value: 1}}}}); err != nil {
			return nil, err
		}
		lockedAt, locked = time.Now(), true
		n := t.open.Add(1)
		for m := t.maxOpen.Load(); n > m && !t.maxOpen.CompareAndSwap(m, n); m = t.maxOpen.Load() {
		}
		var u struct {
			Primary string `bson:"primary"`
		}
		if err := t.users.FindOne(ctx, bson.D{{Key: "_id", Value: user}}).Decode(&u); err != nil {
			return nil, err
		}
		if err := t.partner.SwitchPrimary(ctx, user, u.Primary, identity, sequence(ctx), 0); err != nil {
			return nil, err
		}
		_, err := t.users.UpdateOne(ctx, bson.D{{Key: "_id", Value: user}}, bson.D{
			{Key: "$set", Value: bson.D{{Key: "primary", Value: identity}}},
			{Key: "$inc", Value: bson.D{{Key: "version", Value: 1}}},
		})
		return nil, err
	})
	if locked {
		t.open.Add(-1)
		t.held.add(time.Since(lockedAt))
	}
	return err
}

// report adds what the transactions cost to res.
func (t *txIdentities) report(res *IdentityResult) {
	res.TxAttempts = t.attempts.Load()
	res.TxAborted = res.TxAttempts - t.switches.Load()
	res.TxMaxOpen = t.maxOpen.Load()
	res.TxLockHeld = t.held.latency()
}
