package versioned

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/retry"
)

// Modify reads the document with the given id, calls fn on a fresh copy of
// it, and writes fn's changes back if the document has not changed since it
// was read: one find and one updateOne filtered on the id and the version
// read, that $sets the changed mapped fields, $unsets the removed ones and
// raises the version. It returns the document as stored. If fn changes
// nothing, nothing is written and the document as read is returned.
//
// On a conflict (someone wrote the document in between) Modify reads again
// and calls fn again on the new state, with jittered backoff, under the
// repository's retry policy (Options.Retry, or WithRetry for this call). So
// fn may run several times, each time on a freshly read copy; it must not
// have side effects that cannot be repeated. When the retries run out the
// error matches ErrConflict and retry.ErrExhausted (or
// retry.ErrBudgetExhausted).
//
// An error from fn aborts Modify without a write; Modify returns it wrapped,
// so errors.Is and errors.As reach it. fn must not change the id
// (*InvalidError); changes it makes to the version field are ignored.
//
// With Where filters, the document must match them when read (otherwise fn
// is not called and Modify returns a *GuardError) and when written.
//
// Inside a transaction (ctx carries a session with a transaction in
// progress) Modify makes one attempt and returns a *ConflictError as it is,
// for the transaction's own retry loop to handle.
func (r *Repo[T]) Modify(ctx context.Context, id any, fn func(doc *T) error, opts ...WriteOption) (_ *T, err error) {
	const op = "modify"
	idv, key, err := r.start(ctx, op, id)
	if err != nil {
		return nil, err
	}
	ctx, ob := r.begin(ctx, op, idv)
	defer r.end(&ob, &err)
	if fn == nil {
		return nil, &InvalidError{Op: op, Reason: "fn is nil"}
	}
	cfg := newWriteConfig(opts)
	policy := r.policy(&cfg)
	var (
		result *T
		fnErr  error
	)
	attempt := func(ctx context.Context) error {
		ob.attempts++
		st, err := r.find(ctx, op, idv, key, cfg.guards)
		if errors.Is(err, ErrNotFound) && len(cfg.guards) > 0 {
			// The guarded read missed: tell a failed guard from a missing
			// document. A failed re-read says neither.
			st, err := r.rereadNow(ctx, op, idv, key)
			if err != nil {
				return err
			}
			if st != nil {
				return r.guardError(ctx, op, idv, key, st.version, cfg.guards)
			}
			return r.classify(ctx, op, idv, key, 0, nil, nil)
		}
		if err != nil {
			return err
		}
		if err := checkBase(op, r.opts.VersionField, st.version, true); err != nil {
			return err
		}
		before, err := r.decode(op, idv, st)
		if err != nil {
			return err
		}
		doc, err := r.decode(op, idv, st)
		if err != nil {
			return err
		}
		if err := fn(doc); err != nil {
			fnErr = err
			ob.aborted = true
			return retry.Permanent(err)
		}
		r.s.setVersion(valueOf(doc), st.version)
		set, unset, err := r.changes(op, idv, valueOf(before), doc)
		if err != nil {
			return err
		}
		if err := r.keepsShard(op, idv, key, set, unset); err != nil {
			return err
		}
		if len(set) == 0 && len(unset) == 0 {
			result = doc
			return nil
		}
		if _, err := st.raw.LookupErr(r.opts.MetaField, metaOldW); err == nil {
			// Write ids of the protocol before this one: nobody reads them.
			unset = append(unset, bson.E{Key: r.opts.MetaField + "." + metaOldW, Value: ""})
		}
		base := st.version
		out, err := r.updateCAS(ctx, op, idv, key, base, st, set, unset, &cfg)
		switch {
		case err != nil:
			return err
		case out.landed:
			r.s.setVersion(valueOf(doc), base+1)
			result = doc
			return nil
		case !out.read && !inTransaction(ctx):
			// The next attempt's read, after the backoff, tells whether the
			// document moved, went away or fails the filters: no re-read
			// now, which saves a round trip per conflict.
			return r.conflicted(ctx, &ConflictError{Op: op, ID: idv, Expected: base, Current: -1})
		}
		return r.notApplied(ctx, op, idv, key, base, out, cfg.guards)
	}
	if inTransaction(ctx) {
		err = attempt(ctx)
	} else {
		err = retry.Do(ctx, *policy, attempt)
	}
	var ce *ConflictError
	if errors.As(err, &ce) && ce.Current < 0 && ctx.Err() == nil {
		// The retries ran out on a conflict not yet re-read: read once to
		// report the current version, or why the write did not match.
		st, rerr := r.rereadNow(ctx, op, idv, key)
		if rerr == nil {
			cerr := r.classify(ctx, op, idv, key, ce.Expected, st, cfg.guards)
			var c *ConflictError
			if errors.As(cerr, &c) {
				ce.Current = c.Current
			} else {
				return nil, cerr
			}
		}
	}
	switch {
	case err == nil:
		return result, nil
	case fnErr != nil: // fn's error ends the loop at once
		return nil, fmt.Errorf("versioned: %s %v: fn: %w", op, idv, fnErr)
	case errors.Is(err, retry.ErrExhausted), errors.Is(err, retry.ErrBudgetExhausted),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return nil, wrapErr(op, idv, err)
	}
	return nil, err
}

// changes compares fn's copy doc with before, an untouched copy of the same
// read, field by field (Go values, so a map's key order and a stored
// int32 read into an int64 field do not count as changes), and returns the
// $set of each changed field, as doc encodes it, and the $unset of each
// changed field doc's encoding omits. Fields fn did not change are not
// written. fn may not change the id or a reserved field.
func (r *Repo[T]) changes(op string, id any, before reflect.Value, doc *T) (set, unset bson.D, err error) {
	after := valueOf(doc)
	var raw bson.Raw
	for _, name := range r.s.names {
		index := r.s.mapped[name]
		if name == r.opts.VersionField || equal(before.FieldByIndex(index), after.FieldByIndex(index)) {
			continue
		}
		switch {
		case name == "_id":
			return nil, nil, &InvalidError{Op: op, Field: "_id", Reason: fmt.Sprintf("fn changed the id of %v", id)}
		case r.reserved(name):
			return nil, nil, &InvalidError{Op: op, Field: name, Reason: "fn changed a reserved field (Options.Reserved)"}
		}
		if raw == nil {
			if raw, err = r.encode(op, doc); err != nil {
				return nil, nil, err
			}
		}
		if v, err := raw.LookupErr(name); err == nil {
			set = append(set, bson.E{Key: name, Value: v})
		} else {
			unset = append(unset, bson.E{Key: name, Value: ""})
		}
	}
	return set, unset, nil
}

// equal reports whether two values of one field type are deeply equal,
// without boxing the common scalar kinds.
func equal(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.String:
		return a.String() == b.String()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return a.Int() == b.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return a.Uint() == b.Uint()
	case reflect.Bool:
		return a.Bool() == b.Bool()
	case reflect.Float32, reflect.Float64:
		return a.Float() == b.Float()
	default:
		return reflect.DeepEqual(a.Interface(), b.Interface())
	}
}
