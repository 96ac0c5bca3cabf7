package versioned

import (
	"fmt"
	"slices"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/internal/shard"
	"github.com/mongocas/mongocas/store"
)

// Key names a document of a sharded collection by its id and its shard-key
// values, for Get, Modify and Guarded on a repository configured with
// Options.ShardKey (the package documentation, "Sharded collections", has
// an example). It is [store.Key]; see there for what is checked.
type Key = store.Key

// docKey names a document in every filter of the repository (its Filter
// method builds them all): the encoded id and the document's shard-key
// values (none when the repository has no shard key).
type docKey = shard.Doc

// parseShardKey checks Options.ShardKey against the fields the repository
// writes on every write (which a shard key must not include).
func (o *Options) parseShardKey() (shard.Spec, error) {
	spec, err := shard.Parse(o.ShardKey, func(root string) string {
		switch {
		case root == o.VersionField:
			return "is the version field"
		case root == o.MetaField:
			return "is the write-id field (Options.MetaField)"
		case slices.Contains(o.Reserved, root):
			return "is reserved (Options.Reserved) for another component, such as the lease record"
		}
		return ""
	})
	if err != nil {
		return shard.Spec{}, &InvalidError{Op: "new", Field: "Options.ShardKey", Reason: err.Error()}
	}
	return spec, nil
}

// checkShardKey refuses a T whose documents cannot carry the shard key: a
// field whose top-level name T does not map.
func (s *schema) checkShardKey(spec shard.Spec) error {
	for _, p := range spec.Paths() {
		root, _, _ := strings.Cut(p, ".")
		if _, ok := s.mapped[root]; !ok {
			return &InvalidError{Op: "new", Field: "Options.ShardKey", Reason: fmt.Sprintf("type %s does not map %q, so its documents cannot carry the shard-key field %q", s.typ, root, p)}
		}
	}
	return nil
}

// docShard returns the shard-key values doc holds.
func (r *Repo[T]) docShard(op string, id any, doc *T) (shard.Values, error) {
	if !r.shard.Enabled() {
		return shard.Values{}, nil
	}
	raw, err := r.encode(op, doc)
	if err != nil {
		return shard.Values{}, err
	}
	vals, err := r.shard.FromDoc(raw, id)
	if err != nil {
		return shard.Values{}, &InvalidError{Op: op, Field: "_id", Err: err}
	}
	return vals, nil
}

// keepsShard refuses a Modify whose fn changed a shard-key value: set and
// unset are the top-level fields the write would $set and $unset.
func (r *Repo[T]) keepsShard(op string, id any, key docKey, set, unset bson.D) error {
	if !r.shard.Enabled() {
		return nil
	}
	for _, e := range set {
		v, _ := e.Value.(bson.RawValue) // changes sets raw values
		if f, ok := key.Shard.Differs(e.Key, v, true); ok {
			return shardChange(op, id, f, "fn changed it")
		}
	}
	for _, e := range unset {
		if f, ok := key.Shard.Differs(e.Key, bson.RawValue{}, false); ok {
			return shardChange(op, id, f, "fn removed it")
		}
	}
	return nil
}

// shardMoved refuses an Update of a copy whose shard-key values differ
// from those the repository last read for its id: the copy's filter would
// name no stored document, and the write would change the shard key.
func (r *Repo[T]) shardMoved(op string, id any, key docKey) error {
	if !r.shard.Enabled() {
		return nil
	}
	if seen, ok := r.cache.shardOf(cacheKey(key)); ok && seen != key.Shard.Ident() {
		return shardChange(op, id, r.shard.String(), fmt.Sprintf("the document's values are %s, not those the repository last read for its id", key.Shard))
	}
	return nil
}

func shardChange(op string, id any, field, why string) error {
	return &InvalidError{Op: op, Field: field, Reason: fmt.Sprintf("the shard key of %v cannot be changed (%s): moving a document to another shard needs a transaction or a retryable write through mongos, outside the repository", id, why)}
}

// checkShardPath refuses a Guarded update path that would change a
// shard-key field.
func (r *Repo[T]) checkShardPath(op, path string) error {
	if f, ok := r.shard.Touches(path); ok {
		return shardChange(op, "the document", f, "the update writes "+path)
	}
	return nil
}
