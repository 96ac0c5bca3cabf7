package lease

import "github.com/mongocas/mongocas/versioned"

// Guard returns a versioned.WriteOption that fences a versioned write on this
// lease: the write's filter also requires the lease record's owner and epoch
// (Fence). Once another owner took the lease over, or the lease was released,
// the write changes nothing and fails with a *versioned.GuardError that
// matches ErrLost (through a *LostError with Reason TakenOver: the record no
// longer names this owner and epoch) as well as versioned.ErrGuardFailed.
//
//	err := repo.Update(ctx, &user, l.Guard())
func (l *Lease) Guard() versioned.WriteOption {
	return versioned.WhereErr(l.Fence(), l.lost(TakenOver, record{}))
}
