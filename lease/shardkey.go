package lease

import (
	"fmt"

	"github.com/mongocas/mongocas/internal/shard"
	"github.com/mongocas/mongocas/store"
)

// Key names a document of a sharded collection by its _id and its
// shard-key values, for TryAcquire, Acquire and Do on a Manager made by New
// with Options.ShardKey, and for Stamp on a named lease's Manager with
// Options.ShardKey:
//
//	l, err := m.TryAcquire(ctx, lease.Key{ID: userID, Shard: bson.D{{Key: "tenant", Value: tenant}}})
//
// It is [store.Key]; see there for what is checked.
type Key = store.Key

// docKey names a leased (or stamped) document in every filter on it (its
// Filter method builds them all): the encoded _id and the document's
// shard-key values (none without a shard key, and for a named lease's lock
// document, found by its name).
type docKey = shard.Doc

// parseShardKey checks Options.ShardKey: no field may be under the lease
// record or the fence stamps, which every claim or Stamp changes.
func parseShardKey(fields []string, c *config) (shard.Spec, error) {
	spec, err := shard.Parse(fields, func(root string) string {
		switch root {
		case c.field:
			return "is the lease record (Options.Field)"
		case c.fenceField:
			return "holds the fence stamps (Options.FenceField)"
		}
		return ""
	})
	if err != nil {
		return shard.Spec{}, &OptionsError{Field: "ShardKey", Reason: err.Error()}
	}
	return spec, nil
}

// key checks id, a Key or a bare id, against spec and returns the bare id
// and its docKey. Errors match ErrInvalidID.
func key(spec shard.Spec, id any) (any, docKey, error) {
	bare, vals, err := spec.Split(id)
	if err != nil {
		return nil, docKey{}, err
	}
	raw, err := store.CheckID(bare)
	if err != nil {
		return nil, docKey{}, err
	}
	return bare, docKey{ID: raw, Shard: vals}, nil
}

// leaseKey is key for the id of a lease: a document of the Manager's
// collection, or the name of a named lease, whose lock document is found by
// its _id alone.
func (m *Manager) leaseKey(id any) (any, docKey, error) {
	if !m.named {
		return key(m.c.shard, id)
	}
	if k, ok := id.(Key); ok && len(k.Shard) > 0 {
		return nil, docKey{}, &store.IDError{ID: id, Reason: fmt.Sprintf("a named lease is found by its name alone: pass the name, and shard the lock collection on hashed _id (Options.ShardKey %s is the shard key of the documents Stamp writes)", m.c.shard)}
	}
	return key(shard.Spec{}, id)
}
