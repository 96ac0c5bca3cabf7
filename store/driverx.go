package store

// The one file that imports the driver's x/ packages, which may change in a
// minor release (TestDriverXConfined pins that).

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
// connection could be checked out of the pool (the driver returns a
// checkout error only from an operation's first attempt).
func notSent(err error) bool {
	var (
		sse topology.ServerSelectionError
		wqe topology.WaitQueueTimeoutError
	)
	return IsDeadlineTooClose(err) || errors.As(err, &sse) || errors.As(err, &wqe) ||
		errors.Is(err, topology.ErrPoolClosed) || errors.Is(err, topology.ErrServerClosed)
}
