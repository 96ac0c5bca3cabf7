// Command identity switches users' primary identities at a fake partner
// identity provider (an httptest server with latency and occasional 503s that
// the caller retries), several switches per user at once: with no lock (the
// unlink and link calls interleave and corrupt the primary), under a lease
// (they never do; a double click gets ErrHeld with the time left; the lease
// epoch is the partner's fencing token and idempotency key) and, where the
// server has transactions, with a transaction held across the HTTP calls
// (the anti-pattern: it serializes, at the cost of locks held and waits).
//
//	go run ./examples/identity -users 20 -switches 4 -failure-rate 0.2
//
// This file is the service a reader would write; the fake partner, the
// no-lock and transaction strategies, the requests, the checks and the table
// are in examples/internal.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/examples/internal/cli"
	"github.com/mongocas/mongocas/examples/internal/scenario"
	"github.com/mongocas/mongocas/lease"
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
// for one user apart across all of them.
type identities struct {
	users   *versioned.Repo[User]
	leases  *lease.Manager
	partner partner
}

// newIdentities returns the service on the users collection. owner names
// this process in lease records (and in the errors of those that wait for
// it); ttl must exceed a switch's worst case between two renewals. A
// service gets the collection from a client made once at start-up:
//
//	st, err := store.Connect(ctx, os.Getenv("MONGODB_URI"), nil)
//	...
//	s, err := newIdentities(st.Database("accounts").Collection("users"), idp, hostname, 5*time.Second)
func newIdentities(users *mongo.Collection, p partner, owner string, ttl time.Duration) (*identities, error) {
	repo, err := versioned.New[User](users, nil)
	if err != nil {
		return nil, err
	}
	// A lease on each user's own document: no lock collection, and the
	// user's writes can be fenced on it.
	leases, err := lease.New(users, &lease.Options{TTL: ttl, Owner: owner})
	if err != nil {
		return nil, err // a *lease.OptionsError, matching ErrInvalid
	}
	return &identities{users: repo, leases: leases, partner: p}, nil
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
	_, err = s.users.Guarded(ctx, userID, nil, bson.D{{Key: "$set", Value: bson.D{{Key: "primary", Value: identity}}}}, l.Guard())
	return err
}

// service is this file's service as the scenario runs it, beside the no-lock
// and transaction strategies. The table names it after the call Switch
// makes.
var service = scenario.IdentityStrategy{
	Name: "lease.Manager.Do",
	Kind: scenario.KindMongocas,
	Open: func(users *mongo.Collection, p scenario.PartnerAPI, owner string, ttl time.Duration) (scenario.Identities, error) {
		return newIdentities(users, p, owner, ttl)
	},
}

func main() {
	os.Exit(cli.Main("identity", "Primary identity switch at a partner API: no lock vs lease (vs a transaction held across HTTP).", os.Args[1:], os.Stdout, os.Stderr,
		&scenario.Identity{Mongocas: service}))
}
