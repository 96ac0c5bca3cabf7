// Package settle is the library's one engine for learning what became of a
// write whose reply was lost. Every package that writes sends its writes
// through Exec and supplies how to send the write, read it back, and judge
// that read. See DESIGN.md beside this file.
package settle

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readconcern"

	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/store"
)

// DefaultResolveTimeout is how long Exec keeps re-reading after an
// ambiguous failure, whether or not the caller's context has ended.
const DefaultResolveTimeout = 5 * time.Second

// MaxResends bounds how often one write is sent again (Live, Resend).
const MaxResends = 3

// Verdict is what a read says about a write whose reply was lost.
type Verdict int

const (
	// Landed means the read shows the write.
	Landed Verdict = iota + 1
	// Live means the write has not landed, and a copy of it still in flight
	// could land later.
	Live
	// Dead means the write has not landed and never will.
	Dead
	// Unknown means the write may have landed and its trace be gone since.
	Unknown
)

// Write is one write and what settles it. R is what a reply carries, S
// what a read returns.
type Write[R, S any] struct {
	// Send sends the write once and reports whether the reply says it
	// applied, and what the reply carried.
	Send func(ctx context.Context) (reply R, applied bool, err error)
	// Read reads what shows whether the write landed, at majority (see
	// Majority). It runs under a context of its own that lasts
	// ResolveTimeout, past the caller's.
	Read func(ctx context.Context) (S, error)
	// Judge says what a read shows, and why when it is Unknown.
	Judge func(S) (Verdict, string)
	// Resend says the write may be sent again while Live (a condition lets
	// at most one copy apply); without it, Live is returned as not landed.
	Resend bool
	// Unknown, if set, makes the error Exec returns when it cannot settle
	// the write, from the last read (if hasRead), the reason and the errors;
	// without it Exec returns an *UnknownError.
	Unknown func(read S, hasRead bool, reason string, err error) error
}

// Config is how one caller uses the engine.
type Config struct {
	// Retry is the policy of the re-reads (transient failures only).
	Retry retry.Policy
	// ResolveTimeout bounds the re-reads; zero is DefaultResolveTimeout.
	ResolveTimeout time.Duration
	// Pass, if set, reports read errors that Exec returns as they are.
	Pass func(error) bool
	// Ambiguous, if set, is called once when the first send failed
	// ambiguously; Settled when Exec has judged it (with the error Exec
	// returns for SettledUnknown).
	Ambiguous func(err error)
	Settled   func(s observe.Settlement, err error)
}

// Result is what Exec learned.
type Result[R, S any] struct {
	// Applied is true when the write landed (reply or read).
	Applied bool
	// Reply is what the last send's reply carried, when HasReply.
	Reply    R
	HasReply bool
	// Read is the last read, when HasRead.
	Read    S
	HasRead bool
	// Resent is true when the write was sent more than once: a copy other
	// than the one that landed may still be in flight.
	Resent bool
}

// UnknownError is the error of a write Exec could not settle, when the
// Write has no Unknown.
type UnknownError struct {
	// Reason says why.
	Reason string
	// Err is the first ambiguous error, joined with what failed later.
	Err error
}

func (u *UnknownError) Error() string { return u.Reason + ": " + u.Err.Error() }
func (u *UnknownError) Unwrap() error { return u.Err }

// Exec sends w and, if the send fails ambiguously (store.IsAmbiguous), reads
// back to learn whether it landed (see DESIGN.md, "What the engine does"). A
// send that fails for sure is returned as it is; so is every failure inside
// a transaction, which is the unit its owner retries.
func Exec[R, S any](ctx context.Context, c Config, w Write[R, S]) (res Result[R, S], err error) {
	reply, applied, err := w.Send(ctx)
	if err == nil {
		return Result[R, S]{Applied: applied, Reply: reply, HasReply: true}, nil
	}
	if !store.IsAmbiguous(err) || InTransaction(ctx) {
		return Result[R, S]{}, err
	}
	if c.Ambiguous != nil {
		c.Ambiguous(err)
	}
	if c.Settled != nil {
		defer func() {
			switch {
			case err != nil:
				c.Settled(observe.SettledUnknown, err)
			case res.Applied && res.Resent:
				c.Settled(observe.SettledResent, nil)
			case res.Applied:
				c.Settled(observe.SettledLanded, nil)
			default:
				c.Settled(observe.SettledNotLanded, nil)
			}
		}()
	}
	first, noMatch := err, false
	for resends := 0; ; {
		st, rerr := Reread(ctx, c, w.Read)
		if rerr != nil {
			if c.Pass != nil && c.Pass(rerr) {
				return Result[R, S]{}, rerr
			}
			var none S
			res.Read, res.HasRead = none, false
			return res, w.unknown(res, "re-reading failed", errors.Join(first, rerr))
		}
		res.Read, res.HasRead = st, true
		v, why := w.Judge(st)
		switch v {
		case Landed:
			res.Applied = true
			return res, nil
		case Dead:
			return res, nil
		case Unknown:
			return res, w.unknown(res, why, first)
		case Live:
		}
		// Live: a copy may still land.
		switch {
		case !w.Resend:
			return res, nil
		case noMatch:
			return res, w.unknown(res, "the write's condition no longer holds, but a copy of it may still be in flight", first)
		case ctx.Err() != nil:
			return res, w.unknown(res, "the context ended while a copy of the write may still be in flight", errors.Join(first, store.ContextError(ctx)))
		case resends >= MaxResends:
			return res, w.unknown(res, "the write kept failing ambiguously", first)
		}
		resends++
		res.Resent = true
		reply, applied, err = w.Send(ctx)
		switch {
		case err == nil && applied:
			res.Applied, res.Reply, res.HasReply = true, reply, true
			return res, nil
		case err == nil:
			noMatch = true
		case !store.IsAmbiguous(err):
			return res, w.unknown(res, "sending the write again failed", errors.Join(first, err))
		}
	}
}

// unknown makes the error of a write that could not be settled.
func (w *Write[R, S]) unknown(res Result[R, S], reason string, err error) error {
	if w.Unknown != nil {
		return w.Unknown(res.Read, res.HasRead, reason, err)
	}
	return &UnknownError{Reason: reason, Err: err}
}

// Reread runs read under Detached(ctx), retrying transient failures under
// c.Retry: how every settling read is made.
func Reread[S any](ctx context.Context, c Config, read func(context.Context) (S, error)) (S, error) {
	rctx, cancel := Detached(ctx, c.ResolveTimeout)
	defer cancel()
	return retry.DoValue(rctx, c.Retry, read)
}

// Detached returns a context with ctx's values but not its end, that lasts
// resolve (or DefaultResolveTimeout): for work that must finish regardless.
func Detached(ctx context.Context, resolve time.Duration) (context.Context, context.CancelFunc) {
	if resolve <= 0 {
		resolve = DefaultResolveTimeout
	}
	return context.WithTimeout(context.WithoutCancel(ctx), resolve)
}

// InTransaction reports whether ctx carries a session with a transaction in
// progress.
func InTransaction(ctx context.Context) bool {
	s := mongo.SessionFromContext(ctx)
	return s != nil && s.TransactionRunning()
}

// Majority reads a collection at read concern majority, as every settling
// read must, or at its default once the server refused majority.
type Majority struct {
	coll, majority *mongo.Collection
	refused        atomic.Bool
}

// NewMajority returns the majority reader of coll.
func NewMajority(coll *mongo.Collection) *Majority {
	return &Majority{coll: coll, majority: coll.Clone(options.Collection().SetReadConcern(readconcern.Majority()))}
}

// Read runs read on the majority collection, or on the plain one for good
// once the server refused majority.
func (m *Majority) Read(ctx context.Context, read func(*mongo.Collection) error) error {
	if !m.refused.Load() {
		err := read(m.majority)
		if err == nil || !RefusesMajority(err) {
			return err
		}
		m.refused.Store(true)
	}
	return read(m.coll)
}

// Error codes of a server that does not do read concern majority.
const (
	codeInvalidOptions                = 72
	codeNotImplemented                = 238
	codeReadConcernMajorityNotEnabled = 148
)

// RefusesMajority reports whether err is a server's refusal of read concern
// majority (code 148, or 72/238 naming the read concern), not a failure of
// the read itself.
func RefusesMajority(err error) bool {
	var se mongo.ServerError
	if !errors.As(err, &se) {
		return false
	}
	if se.HasErrorCode(codeReadConcernMajorityNotEnabled) {
		return true
	}
	return (se.HasErrorCode(codeInvalidOptions) || se.HasErrorCode(codeNotImplemented)) &&
		strings.Contains(strings.ToLower(err.Error()), "readconcern")
}
