package store

// This is the one file of the library that imports the driver's x/ packages,
// which the driver says may change without notice in a minor release. Every
// other file reaches them through the helpers below, so a driver upgrade that
// moves them breaks this file alone. TestDriverXConfined pins that.

import (
	"errors"

	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"
)

// IsDeadlineTooClose reports whether err, or any error it wraps, is the
// driver's refusal to send an operation because the context's deadline was
// too close for it to finish ("operation not sent to server, as Timeout would
// be exceeded"). Nothing was sent, and trying again under the same deadline
// cannot help. Such an error also matches context.DeadlineExceeded.
func IsDeadlineTooClose(err error) bool {
	return err != nil && errors.Is(err, driver.ErrDeadlineWouldBeExceeded)
}

// notSent reports whether the driver gave up before sending the request:
// no server could be selected, the deadline was too close to try, or no
// connection could be checked out of the pool (the context ended while
// waiting for one, or the pool or server was closed). The driver returns a
// checkout error only from an operation's first attempt (a retry that
// cannot check out returns the first attempt's error), so none of these
// follows a send.
func notSent(err error) bool {
	var (
		sse topology.ServerSelectionError
		wqe topology.WaitQueueTimeoutError
	)
	return IsDeadlineTooClose(err) || errors.As(err, &sse) || errors.As(err, &wqe) ||
		errors.Is(err, topology.ErrPoolClosed) || errors.Is(err, topology.ErrServerClosed)
}
