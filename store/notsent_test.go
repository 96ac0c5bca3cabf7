package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"

	"github.com/mongocas/mongocas/store"
)

// TestPoolCheckoutFailureIsNotAmbiguous: a write whose context ends while it
// waits for a connection from the pool (or whose pool or server is closed)
// was never sent, so it is not ambiguous, and the context's error stays
// reachable for the caller.
func TestPoolCheckoutFailureIsNotAmbiguous(t *testing.T) {
	wq := fmt.Errorf("op: %w", topology.WaitQueueTimeoutError{Wrapped: context.DeadlineExceeded})
	require.False(t, store.IsAmbiguous(wq))
	require.ErrorIs(t, wq, context.DeadlineExceeded)
	require.True(t, store.IsTimeout(wq), "still a timeout, only not an ambiguous one")
	require.False(t, store.IsAmbiguous(fmt.Errorf("op: %w", topology.WaitQueueTimeoutError{Wrapped: context.Canceled})))
	require.False(t, store.IsAmbiguous(fmt.Errorf("op: %w", topology.ErrPoolClosed)))
	require.False(t, store.IsAmbiguous(fmt.Errorf("op: %w", topology.ErrServerClosed)))
}
