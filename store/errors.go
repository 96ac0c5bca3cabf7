package store

import (
	"context"
	"errors"
	"strings"

	"go.mongodb.org/mongo-driver/v2/mongo"
)

// Server error labels that the classification functions look for.
const (
	// LabelTransientTransaction marks an error after which the whole
	// transaction may be retried.
	LabelTransientTransaction = "TransientTransactionError"
	// LabelRetryableWrite marks a write the server says may be retried.
	LabelRetryableWrite = "RetryableWriteError"
	// LabelUnknownCommitResult marks a commit whose outcome is unknown.
	LabelUnknownCommitResult = "UnknownTransactionCommitResult"
)

// Server error codes that the classification functions look for.
const (
	codeWriteConflict = 112
	codeInternalError = 1
)

// IsDuplicateKey reports whether err, or any error it wraps, is a duplicate
// key error from the server: codes 11000, 11001 and 12582, or FerretDB v2's
// answer to a duplicate key inside findAndModify (code 1, InternalError,
// with PostgreSQL's message for a unique or exclusion violation).
func IsDuplicateKey(err error) bool {
	return err != nil && (mongo.IsDuplicateKeyError(err) || isPostgresError(err,
		"duplicate key value violates unique constraint ",
		"conflicting key value violates exclusion constraint "))
}

// isPostgresError reports whether err is DocumentDB's pass-through of a
// PostgreSQL error (code 1, InternalError) whose message starts with one of
// prefixes. Nothing else reads message text.
func isPostgresError(err error, prefixes ...string) bool {
	var ce mongo.CommandError
	if !errors.As(err, &ce) || ce.Code != codeInternalError || ce.Name != "InternalError" {
		return false
	}
	for _, p := range prefixes {
		if strings.HasPrefix(ce.Message, p) {
			return true
		}
	}
	return false
}

// IsNetwork reports whether err, or any error it wraps, is a network failure
// between the driver and the server. The outcome of a write that failed with a
// network error is unknown: it may have been applied.
func IsNetwork(err error) bool {
	return err != nil && mongo.IsNetworkError(err)
}

// IsTimeout reports whether err, or any error it wraps, is a timeout: a context
// deadline, a driver or socket timeout, or the server's MaxTimeMSExpired. The
// outcome of a write that timed out is unknown, as for a network error.
func IsTimeout(err error) bool {
	return err != nil && mongo.IsTimeout(err)
}

// HasLabel reports whether err, or any error it wraps, carries the server or
// driver error label.
func HasLabel(err error, label string) bool {
	var le mongo.LabeledError
	return errors.As(err, &le) && le.HasErrorLabel(label)
}

// IsWriteConflict reports whether err is the server's WriteConflict (code
// 112), or DocumentDB's pass-through of PostgreSQL's "deadlock detected"
// (code 1, InternalError). The write was not applied; it is always safe to
// retry the operation that caused it.
func IsWriteConflict(err error) bool {
	var se mongo.ServerError
	return (errors.As(err, &se) && se.HasErrorCode(codeWriteConflict)) || isPostgresError(err, "deadlock detected")
}

// IsTransient reports whether err is a failure that may pass if the same
// operation is tried again: a network error, a timeout that is not the
// caller's own context ending, a write conflict, or an error labelled
// RetryableWriteError or TransientTransactionError. Cancellation of the
// caller's context is never transient.
func IsTransient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	return IsNetwork(err) ||
		IsTimeout(err) ||
		IsWriteConflict(err) ||
		HasLabel(err, LabelRetryableWrite) ||
		HasLabel(err, LabelTransientTransaction)
}

// IsAmbiguous reports whether a write that failed with err may nevertheless
// have been applied by the server, so that only a re-read can tell:
//
//   - a network error or a timeout after the request may have been sent;
//   - a reply with a writeConcernError: the primary applied the write but
//     could not confirm the requested write concern (a wtimeout, or a
//     primary that stepped down while waiting);
//   - an error labelled RetryableWriteError or UnknownTransactionCommitResult:
//     the server or the driver says the write may be retried, which is not
//     the same as "it was not applied";
//   - a failure whose reply could not be decoded after sending.
//
// Failures the driver reports before sending anything (no server could be
// selected, or the deadline was too close to try) are not ambiguous, and
// neither is a write error the server returned for the write itself (a
// duplicate key, a validation failure): those writes were not applied.
func IsAmbiguous(err error) bool {
	if err == nil || notSent(err) || hasWriteErrors(err) {
		return false
	}
	return IsNetwork(err) || IsTimeout(err) || HasWriteConcernError(err) ||
		HasLabel(err, LabelRetryableWrite) || HasLabel(err, LabelUnknownCommitResult)
}

// hasWriteErrors reports whether the server returned write errors for the
// write itself: such a write was not applied.
func hasWriteErrors(err error) bool {
	var we mongo.WriteException
	if errors.As(err, &we) && len(we.WriteErrors) > 0 {
		return true
	}
	var bwe mongo.BulkWriteException
	return errors.As(err, &bwe) && len(bwe.WriteErrors) > 0
}

// HasWriteConcernError reports whether err, or any error it wraps, carries a
// writeConcernError: the server applied the write but could not confirm the
// requested write concern.
func HasWriteConcernError(err error) bool {
	var we mongo.WriteException
	if errors.As(err, &we) && we.WriteConcernError != nil {
		return true
	}
	var bwe mongo.BulkWriteException
	return errors.As(err, &bwe) && bwe.WriteConcernError != nil
}
