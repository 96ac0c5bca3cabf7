package lease

import (
	"context"
	"fmt"

	"github.com/mongocas/mongocas/store"
)

// Mode returns the mode the Manager judges expiry in: Options.Mode if it was
// forced, else the one found by trying the server (once per client, see
// store.For, on the first call that needs it; a failure to reach the server
// is returned and tried again next time).
func (m *Manager) Mode(ctx context.Context) (Mode, error) {
	if err := store.CheckContext(ctx); err != nil {
		return ModeAuto, fmt.Errorf("lease: mode: %w", err)
	}
	server, err := m.serverMode(store.NoSession(ctx))
	switch {
	case err != nil:
		return ModeAuto, fmt.Errorf("lease: mode: %w", err)
	case server:
		return ModeServer, nil
	default:
		return ModeEstimated, nil
	}
}

// serverMode reports whether the Manager runs in ModeServer, from the
// client's capabilities in ModeAuto (store.Server.Capabilities: $expr with
// $$NOW in a write filter and update pipelines, tried once per client).
func (m *Manager) serverMode(ctx context.Context) (bool, error) {
	if mode := Mode(m.mode.Load()); mode != ModeAuto {
		return mode == ModeServer, nil
	}
	caps, err := store.For(m.coll.Database().Client()).Capabilities(ctx, m.coll.Database())
	if err != nil {
		return false, err
	}
	mode := ModeEstimated
	if caps.Expr && caps.UpdatePipelines {
		mode = ModeServer
	}
	m.mode.Store(int32(mode))
	return mode == ModeServer, nil
}
