package scenario

import (
	"cmp"
	"context"
	"errors"
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
	"github.com/mongocas/mongocas/versioned"
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
//   - lease: lease.Manager.Do on the user's document around the whole
//     sequence. Switches for the same user wait their turn; none interleave.
//     The lease's epoch goes to the partner as the fencing token and in the
//     idempotency key, and the final write is fenced with Lease.Guard. A
//     double click that arrives while a switch runs gets ErrHeld at once,
//     with the time left on the lease (a 409 with Retry-After).
//   - transaction held across the HTTP calls (the anti-pattern of seed 002):
//     the first write of a transaction takes the user's document, and the
//     transaction stays open through the partner calls. It does stop the
//     interleaving, but every other switch for that user spins on write
//     conflicts meanwhile, and the server holds an open transaction and a
//     document lock for as long as the partner takes. Only where the server
//     has transactions.

// IdentityStrategy names a way to run the switch.
type IdentityStrategy string

// The identity strategies.
const (
	// IdentityNoLock calls the partner with no coordination.
	IdentityNoLock IdentityStrategy = "no lock"
	// IdentityLease runs the switch under lease.Manager.Do.
	IdentityLease IdentityStrategy = "lease.Manager.Do"
	// IdentityTxAcrossHTTP holds a transaction open across the partner calls.
	IdentityTxAcrossHTTP IdentityStrategy = "transaction held across HTTP"
)

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
	// DoubleClicks is how many double clicks were tried (lease only), and
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
}

// User is the local user document. The lease subdocument lives on it too,
// unmapped, as the lease package requires.
type User struct {
	ID         string   `bson:"_id"`
	Primary    string   `bson:"primary"`
	Identities []string `bson:"identities"`
	Version    int64    `bson:"version"`
}

// RunIdentity runs one identity strategy against a fresh fake partner and a
// fresh collection of db. transactions says whether the server has them.
func RunIdentity(ctx context.Context, db *mongo.Database, s IdentityStrategy, transactions bool, cfg IdentityConfig) (*IdentityResult, error) {
	cfg = cfg.withDefaults()
	if s == IdentityTxAcrossHTTP && !transactions {
		return nil, ErrNoTransactions
	}
	coll := db.Collection("users_" + slug(string(s)))
	if err := coll.Drop(ctx); err != nil {
		return nil, fmt.Errorf("identity: drop: %w", err)
	}
	users, err := versioned.New[User](coll, nil)
	if err != nil {
		return nil, err
	}
	partner := NewPartner(PartnerConfig{LatencyMin: cfg.LatencyMin, LatencyMax: cfg.LatencyMax, FailureRate: cfg.FailureRate, Seed: cfg.Seed})
	defer partner.Close()
	client := partner.Client(retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 200 * time.Millisecond, MaxAttempts: 10, MaxElapsedTime: 3 * time.Second})
	defer client.Close()

	ids := make([]string, cfg.Users)
	for u := range ids {
		ids[u] = fmt.Sprintf("user-%02d", u+1)
		idents := make([]string, cfg.Switches+1)
		for k := range idents {
			idents[k] = fmt.Sprintf("%s-id%d", ids[u], k)
		}
		partner.AddUser(ids[u], idents)
		if err := users.Insert(ctx, &User{ID: ids[u], Primary: idents[0], Identities: idents}); err != nil {
			return nil, fmt.Errorf("identity: insert user: %w", err)
		}
	}

	warmUp(ctx, db, cfg.Users*cfg.Switches)
	res := &IdentityResult{Row: Row{Scenario: "identity", Strategy: string(s), Kind: kindOf(s == IdentityLease), Requests: cfg.Users * cfg.Switches}, Users: cfg.Users, Switches: cfg.Switches}
	// Request r is user r/Switches switching to identity 1 + r%Switches.
	type request struct {
		user, target, seq string
	}
	reqs := make([]request, res.Requests)
	for r := range reqs {
		u := r / cfg.Switches
		reqs[r] = request{user: ids[u], target: fmt.Sprintf("%s-id%d", ids[u], 1+r%cfg.Switches), seq: "switch-" + strconv.Itoa(r)}
	}

	var run func(ctx context.Context, r int) error
	var finish func()
	switch s {
	case IdentityNoLock:
		run = func(ctx context.Context, r int) error {
			q := reqs[r]
			u, err := users.Get(ctx, q.user)
			if err != nil {
				return err
			}
			if err := switchAtPartner(ctx, client, q.user, u.Primary, q.target, q.seq, q.seq, 0); err != nil {
				return err
			}
			_, err = coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: q.user}}, bson.D{{Key: "$set", Value: bson.D{{Key: "primary", Value: q.target}}}})
			return err
		}
	case IdentityLease:
		run, finish, err = leaseSwitch(coll, users, client, cfg, res, func(r int) (string, string, string) { q := reqs[r]; return q.user, q.target, q.seq })
		if err != nil {
			return nil, err
		}
	case IdentityTxAcrossHTTP:
		run, finish = txSwitch(db.Client(), coll, client, res, func(r int) (string, string, string) { q := reqs[r]; return q.user, q.target, q.seq })
	default:
		return nil, fmt.Errorf("identity: unknown strategy %q", s)
	}
	if s == IdentityTxAcrossHTTP {
		res.Kind = KindAntiPattern
	}

	outcomes := make([]error, len(reqs))
	var rec recorder
	start := time.Now()
	p := startProgress(cfg.Progress, "identity/"+string(s), len(reqs))
	forEach(len(reqs), 0, p, func(r int) {
		rec.time(func() { outcomes[r] = run(ctx, r) })
	})
	p.end()
	if finish != nil {
		finish()
	}
	res.Elapsed, res.Latency = time.Since(start), rec.latency()

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
		u, err := users.Get(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("identity: read user: %w", err)
		}
		if prim := partner.Primaries(id); len(prim) != 1 || prim[0] != u.Primary {
			res.Corrupted++
		}
	}
	res.Anomalies = res.Partner.Interleaved + res.Corrupted + (res.DoubleClicks - res.DoubleClickHeld)

	res.Details = append(res.Details,
		fmt.Sprintf("%d users × %d concurrent switches: %d done, %d failed", cfg.Users, cfg.Switches, res.Done, res.Failed),
		fmt.Sprintf("partner: %d calls, %d answered 503 (%d caller retries, %d replies replayed by idempotency key), %d stale fencing tokens refused",
			res.Partner.Calls, res.Partner.Failed, res.PartnerRetries, res.Partner.Replayed, res.Partner.StaleTokens),
		fmt.Sprintf("interleaved unlink/link sequences: %d%s; users left with a corrupted primary: %d",
			res.Partner.Interleaved, plural(res.Partner.InterleavedUsers, " (%d user%s)"), res.Corrupted))
	if s == IdentityLease {
		line := fmt.Sprintf("double clicks: %d, %d got ErrHeld at once", res.DoubleClicks, res.DoubleClickHeld)
		if res.DoubleClickHeld > 0 {
			line += fmt.Sprintf(" (a 409: held by %s, retry after %v)", res.DoubleClickHolder, res.DoubleClickTimeLeft.Round(time.Millisecond))
		}
		res.Details = append(res.Details, line, "each switch sent its lease epoch to the partner as fencing token and idempotency key")
	}
	if s == IdentityTxAcrossHTTP {
		res.Details = append(res.Details, fmt.Sprintf("up to %d transactions at once held a user's document locked across the partner calls, each for p50 %v, max %v; %d of %d transaction attempts were aborted by write conflicts and retried (the other switches waited)",
			res.TxMaxOpen, res.TxLockHeld.P50.Round(time.Millisecond), res.TxLockHeld.Max.Round(time.Millisecond), res.TxAborted, res.TxAttempts))
	}
	if firstErr != nil {
		res.Details = append(res.Details, fmt.Sprintf("first failure: %v", firstErr))
	}
	return res, nil
}

// leaseSwitch returns the lease strategy's request function. Two Managers
// stand for two instances of the service, so that switches for one user
// compete across processes as well as within one. The first switch of each
// user to get the lease is double-clicked: a second request for the same
// user tries TryAcquire while the switch runs, and must get ErrHeld.
func leaseSwitch(coll *mongo.Collection, users *versioned.Repo[User], client *PartnerClient, cfg IdentityConfig, res *IdentityResult,
	req func(r int) (user, target, seq string),
) (run func(context.Context, int) error, finish func(), err error) {
	var managers [2]*lease.Manager
	for i := range managers {
		managers[i], err = lease.New(coll, &lease.Options{TTL: cfg.LeaseTTL, Owner: fmt.Sprintf("service-instance-%d", i+1)})
		if err != nil {
			return nil, nil, err
		}
	}
	var (
		mu      sync.Mutex
		clicked = map[string]bool{}
		wg      sync.WaitGroup
	)
	run = func(ctx context.Context, r int) error {
		user, target, seq := req(r)
		m := managers[r%2]
		return m.Do(ctx, user, func(ctx context.Context, l *lease.Lease) error {
			mu.Lock()
			first := !clicked[user]
			clicked[user] = true
			if first {
				res.DoubleClicks++
			}
			mu.Unlock()
			var clickDone chan struct{}
			if first {
				// The double click lands while this switch holds the
				// lease: this switch does not release it before the
				// click has had its answer.
				clickDone = make(chan struct{})
				wg.Go(func() {
					defer close(clickDone)
					other := managers[(r+1)%2]
					if err := doubleClickOnce(ctx, other, user, &mu, res); err != nil {
						mu.Lock()
						res.Details = append(res.Details, "double click: "+err.Error())
						mu.Unlock()
					}
				})
			}
			u, err := users.Get(ctx, user)
			if err == nil {
				key := fmt.Sprintf("%s/epoch-%d", user, l.Epoch())
				err = switchAtPartner(ctx, client, user, u.Primary, target, seq, key, l.Epoch())
			}
			if err == nil && target != u.Primary {
				_, err = users.Guarded(ctx, user, nil, bson.D{{Key: "$set", Value: bson.D{{Key: "primary", Value: target}}}}, l.Guard())
			}
			if clickDone != nil {
				<-clickDone
			}
			return err
		})
	}
	return run, wg.Wait, nil
}

// doubleClickOnce is a second request for user while a switch holds the
// lease: TryAcquire must fail at once with ErrHeld.
func doubleClickOnce(ctx context.Context, m *lease.Manager, user string, mu *sync.Mutex, res *IdentityResult) error {
	l, err := m.TryAcquire(ctx, user)
	if err == nil {
		_ = l.Release(ctx)
		return fmt.Errorf("it got the lease on %s while a switch was running", user)
	}
	var held *lease.HeldError
	if !errors.As(err, &held) {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	res.DoubleClickHeld++
	if res.DoubleClickTimeLeft == 0 {
		res.DoubleClickTimeLeft, res.DoubleClickHolder = held.TimeLeft, held.Owner
	}
	return nil
}

// txSwitch returns the anti-pattern's request function: the switch runs
// inside a transaction whose first write takes the user's document, and the
// partner calls happen while it is open.
func txSwitch(mc *mongo.Client, coll *mongo.Collection, client *PartnerClient, res *IdentityResult,
	req func(r int) (user, target, seq string),
) (run func(context.Context, int) error, finish func()) {
	var (
		open, maxOpen, attempts atomic.Int64
		held                    recorder
	)
	run = func(ctx context.Context, r int) error {
		user, target, seq := req(r)
		sess, err := mc.StartSession()
		if err != nil {
			return err
		}
		defer sess.EndSession(context.WithoutCancel(ctx))
		var lockedAt time.Time
		locked := false
		_, err = sess.WithTransaction(ctx, func(ctx context.Context) (any, error) {
			attempts.Add(1)
			if locked { // a retry of a transaction that had the lock
				open.Add(-1)
				locked = false
			}
			// The first write takes the document: any other transaction
			// writing it now fails with a write conflict and starts over.
			if _, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: user}}, bson.D{{Key: "$inc", Value: bson.D{{Key: "switches", Value: 1}}}}); err != nil {
				return nil, err
			}
			lockedAt, locked = time.Now(), true
			n := open.Add(1)
			for m := maxOpen.Load(); n > m && !maxOpen.CompareAndSwap(m, n); m = maxOpen.Load() {
			}
			var u User
			if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: user}}).Decode(&u); err != nil {
				return nil, err
			}
			if err := switchAtPartner(ctx, client, user, u.Primary, target, seq, seq, 0); err != nil {
				return nil, err
			}
			_, err := coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: user}}, bson.D{
				{Key: "$set", Value: bson.D{{Key: "primary", Value: target}}},
				{Key: "$inc", Value: bson.D{{Key: "version", Value: 1}}},
			})
			return nil, err
		})
		if locked {
			open.Add(-1)
			el := time.Since(lockedAt)
			held.mu.Lock()
			held.d = append(held.d, el)
			held.mu.Unlock()
		}
		return err
	}
	finish = func() {
		res.TxAttempts = attempts.Load()
		res.TxAborted = res.TxAttempts - int64(res.Requests)
		res.TxMaxOpen = maxOpen.Load()
		res.TxLockHeld = held.latency()
	}
	return run, finish
}
