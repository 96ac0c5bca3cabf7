// Command identity switches users' primary identities at a fake partner
// identity provider (an httptest server with latency and occasional 503s that
// the caller retries), several switches per user at once: with no lock (the
// unlink and link calls interleave and corrupt the primary), under a lease
// (they never do; a double click gets ErrHeld with the time left; the lease
// epoch is the partner's fencing token and idempotency key) and, where the
// server has transactions, with a transaction held across the HTTP calls
// (the anti-pattern: it serializes, at the cost of locks held and waits).
// Over HTTP, the switch takes an Idempotency-Key: a client that timed out
// and retries gets the first answer, and never switches twice.
//
//	go run ./examples/identity -users 20 -switches 4 -failure-rate 0.2
//
// This file is the service a reader would write; the fake partner, the
// no-lock and transaction strategies, the requests, the checks and the table
// are in examples/internal.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/examples/internal/cli"
	"github.com/mongocas/mongocas/examples/internal/scenario"
	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/lease"
	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/versioned"
)

// User is a user with the identities linked at the partner. The lease
// record lives on the same document, in a field User does not map
// ("_lease"); the repository refuses to write it.
type User struct {
	ID         string   `bson:"_id"`
	Primary    string   `bson:"primary"`
	Identities []string `bson:"identities"`
	Version    int64    `bson:"version"`
}

// partner is the partner identity provider's API: promoting an identity to
// primary is two HTTP calls (unlink, then link) that it cannot make atomic.
// It dedupes calls on the idempotency key and refuses a fencing token older
// than one it has seen for the user.
type partner interface {
	SwitchPrimary(ctx context.Context, user, from, identity, idempotencyKey string, fencingToken int64) error
}

// identities is the service. Run one per process: leases keep switches
// for one user apart across all of them, and idempotency keys make a
// client's retry of one switch safe.
type identities struct {
	users   *versioned.Repo[User]
	leases  *lease.Manager
	keys    *idempotency.Keys
	partner partner
}

// newIdentities returns the service on the users collection. owner names
// this process in lease records (and in the errors of those that wait for
// it); ttl must exceed a switch's worst case between two renewals. A
// service gets the collection from a client made once at start-up:
//
//	st, err := store.Connect(ctx, os.Getenv("MONGODB_URI"), nil)
//	...
//	s, err := newIdentities(st.Database("accounts").Collection("users"), idp, hostname, 5*time.Second, observe.Slog(logger))
//
// obs sees each call, conflict, retry and lost reply, and each lease
// acquired, held by another, renewed, lost or released (nil: none).
func newIdentities(users *mongo.Collection, p partner, owner string, ttl time.Duration, obs observe.Observer) (*identities, error) {
	repo, err := versioned.New[User](users, &versioned.Options{Observer: obs})
	if err != nil {
		return nil, err
	}
	// A lease on each user's own document: no lock collection, and the
	// user's writes can be fenced on it.
	leases, err := lease.New(users, &lease.Options{TTL: ttl, Owner: owner, Observer: obs})
	if err != nil {
		return nil, err // a *lease.OptionsError, matching ErrInvalid
	}
	// The switch requests' idempotency keys, in a collection of their own,
	// kept a day (call keys.EnsureIndexes once at start-up for their
	// clean-up).
	keys, err := idempotency.New(users.Database().Collection(users.Name()+"_switch_requests"), &idempotency.Options{TTL: ttl, Owner: owner})
	if err != nil {
		return nil, err
	}
	return &identities{users: repo, leases: leases, keys: keys, partner: p}, nil
}

// AddUser stores a user whose first identity is primary.
func (s *identities) AddUser(ctx context.Context, id string, ids []string) error {
	return s.users.Insert(ctx, &User{ID: id, Primary: ids[0], Identities: ids})
}

// Switch makes identity the user's primary one, at the partner and then
// here. One switch per user runs at a time: Do waits for the lease on the
// user's document, renews it while the partner calls run, and releases it.
// No transaction, lock or connection is held meanwhile.
func (s *identities) Switch(ctx context.Context, userID, identity string) error {
	err := s.leases.Do(ctx, userID, func(ctx context.Context, l *lease.Lease) error {
		// ctx ends if the lease is lost.
		return s.switchHeld(ctx, l, userID, identity)
	})
	if errors.Is(err, lease.ErrLost) {
		// The lease expired or was taken over midway. The partner refused
		// the stale fencing token and the fenced write changed nothing:
		// the switch may be tried again.
		return fmt.Errorf("switch of %s interrupted, try again: %w", userID, err)
	}
	return err // nil, lease.ErrNotFound (no such user), the partner's error...
}

// SwitchNow is Switch for a request that must not wait, such as a double
// click: while another switch for the user runs, it fails at once with a
// *lease.HeldError, whose TimeLeft an HTTP handler sends as Retry-After with
// a 409. Its lease is not renewed: the switch must finish within the TTL.
func (s *identities) SwitchNow(ctx context.Context, userID, identity string) error {
	l, err := s.leases.TryAcquire(ctx, userID)
	if held, ok := errors.AsType[*lease.HeldError](err); ok {
		return fmt.Errorf("a switch of %s is running (held by %s), retry in %v: %w",
			userID, held.Owner, held.TimeLeft.Round(time.Millisecond), err)
	}
	if err != nil {
		return err
	}
	defer func() { _ = l.Release(context.WithoutCancel(ctx)) }()
	// Stop when the lease ends (l.Context) as well as when ctx does.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(l.Context(), cancel)()
	return s.switchHeld(ctx, l, userID, identity)
}

// switchHeld switches while l is held. The lease's epoch grows with each
// holder: it is the fencing token the partner checks and, with the user id,
// the idempotency key under which the partner dedupes retried calls.
func (s *identities) switchHeld(ctx context.Context, l *lease.Lease, userID, identity string) error {
	u, err := s.users.Get(ctx, userID)
	if err != nil {
		return err
	}
	if u.Primary == identity {
		return nil
	}
	key := fmt.Sprintf("%s/epoch-%d", userID, l.Epoch())
	if err := s.partner.SwitchPrimary(ctx, userID, u.Primary, identity, key, l.Epoch()); err != nil {
		return err
	}
	// Fenced: the write applies only while this lease is still held;
	// otherwise it fails with an error matching lease.ErrLost.
	_, err = s.users.Guarded(ctx, userID, nil, bson.D{{Key: "$set", Value: bson.D{{Key: "primary", Value: identity}}}}, versioned.WhereErr(l.Fence(), lease.ErrLost))
	return err
}

// errUnknownIdentity is the answer to a switch to an identity the user has
// not linked.
var errUnknownIdentity = errors.New("no such identity")

// Handler is the service's HTTP API: POST /users/{user}/primary with the
// identity as the body and an Idempotency-Key header (a UUID, say) that the
// client keeps when it retries. The first request with a key switches; a
// retry gets its answer back (Idempotent-Replayed: true) without switching
// again, even when another switch for the user has run since; a retry
// while the first still runs gets 409 with Retry-After. A real service
// also scopes the keys by the authenticated caller (HTTPOptions.Scope).
func (s *identities) Handler() (http.Handler, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /users/{user}/primary", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		user, identity := r.PathValue("user"), strings.TrimSpace(string(body))
		err = s.switchOnce(r.Context(), idempotency.CallFrom(r.Context()), user, identity)
		switch {
		case err == nil: // final: stored, replayed
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]string{"user": user, "primary": identity})
		case errors.Is(err, lease.ErrNotFound), errors.Is(err, errUnknownIdentity):
			http.Error(w, err.Error(), http.StatusNotFound) // final too
		default:
			// Transient (the partner, the database, a lost lease): not
			// stored, so the client's retry runs the switch again, from
			// its last checkpoint.
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})
	return s.keys.Handler(mux, nil)
}

// switchOnce is Switch for one request with an idempotency key, c. The
// lease keeps other switches of the user out; c makes a rerun of this one
// (after a timeout or a crash) resume instead of switching again: the
// partner's two calls are one step, whose partner key is the same in every
// run that resumes it, so the partner replays what it already applied.
func (s *identities) switchOnce(ctx context.Context, c *idempotency.Call, userID, identity string) error {
	return s.leases.Do(ctx, userID, func(ctx context.Context, l *lease.Lease) error {
		u, err := s.users.Get(ctx, userID)
		if err != nil {
			return err
		}
		if !slices.Contains(u.Identities, identity) {
			return fmt.Errorf("%s of %s: %w", identity, userID, errUnknownIdentity)
		}
		if u.Primary == identity {
			return nil
		}
		_, err = c.Step(ctx, "partner-switch", func(ctx context.Context, partnerKey string) ([]byte, error) {
			return nil, s.partner.SwitchPrimary(ctx, userID, u.Primary, identity, partnerKey, l.Epoch())
		})
		if err != nil {
			return err
		}
		_, err = s.users.Guarded(ctx, userID, nil, bson.D{{Key: "$set", Value: bson.D{{Key: "primary", Value: identity}}}}, versioned.WhereErr(l.Fence(), lease.ErrLost))
		return err
	})
}

// events counts what the service's repository and lease manager report; the
// program prints the counts under its table.
var events observe.Counters

// service is this file's service as the scenario runs it, beside the no-lock
// and transaction strategies. The table names it after the call Switch
// makes.
var service = scenario.IdentityStrategy{
	Name: "lease.Manager.Do",
	Kind: scenario.KindMongocas,
	Open: func(users *mongo.Collection, p scenario.PartnerAPI, owner string, ttl time.Duration) (scenario.Identities, error) {
		return newIdentities(users, p, owner, ttl, &events)
	},
}

func main() {
	os.Exit(cli.Main("identity", "Primary identity switch at a partner API: no lock vs lease (vs a transaction held across HTTP).", os.Args[1:], os.Stdout, os.Stderr,
		&scenario.Identity{Mongocas: service}, &events))
}
