package versioned

import (
	"context"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// maxCached bounds the documents a repository remembers.
const maxCached = 4096

// seen is what a repository last observed of one document: the highest
// version it saw and the write ids that observation carried, plus the write
// ids of its own writes that it knows landed. It serves two purposes only,
// neither of which correctness depends on: Guarded takes its base version
// from it instead of reading first, and writes prune the write ids it lists.
type seen struct {
	version int64
	writes  map[string]entry
}

// entry is a write id known to be in a document.
type entry struct {
	base int64 // the version recorded with it
	// done marks a write of this repository whose outcome its caller has
	// learned and of which no other copy can still apply: nobody needs its
	// write id any more, so the next write removes it.
	done bool
}

// docCache remembers, per document id, the last observation. It is safe
// for concurrent use and forgets an arbitrary document when full.
type docCache struct {
	mu   sync.Mutex
	docs map[string]*seen
}

func newDocCache() *docCache { return &docCache{docs: map[string]*seen{}} }

// cacheKey identifies a document by the BSON encoding of its id.
func cacheKey(id bson.RawValue) string {
	return string(rune(id.Type)) + string(id.Value)
}

// observe records a stored document read at version ver with the given
// write-id subdocument. Observations older than the one held are ignored,
// and so are those made inside a transaction (see committed).
func (c *docCache) observe(ctx context.Context, key string, ver int64, writes bson.Raw) {
	if !committed(ctx) {
		return
	}
	elems, _ := writes.Elements()
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.docs[key]
	if s != nil && s.version > ver {
		return
	}
	old := map[string]entry(nil)
	if s == nil {
		c.evictLocked()
		s = &seen{}
		c.docs[key] = s
	} else {
		old = s.writes
	}
	s.version = ver
	s.writes = make(map[string]entry, len(elems))
	for _, e := range elems {
		if v, ok := asInt(e.Value()); ok {
			s.writes[e.Key()] = entry{base: v, done: old[e.Key()].done}
		}
	}
}

// wrote records a write of ours that landed: the document is at least at
// version ver, carries write id wid (recorded with base; done as for
// entry.done) and no longer carries the pruned ids. Writes made inside a
// transaction are not recorded (see committed).
func (c *docCache) wrote(ctx context.Context, key string, ver int64, wid string, base int64, done bool, pruned []string) {
	if !committed(ctx) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.docs[key]
	if s == nil {
		c.evictLocked()
		s = &seen{writes: map[string]entry{}}
		c.docs[key] = s
	}
	s.version = max(s.version, ver)
	for _, k := range pruned {
		delete(s.writes, k)
	}
	s.writes[wid] = entry{base: base, done: done}
}

// committed reports whether what is read and written with ctx is
// committed at once, that is, ctx carries no transaction. A version seen
// inside a transaction may be rolled back with it, and pruning must only
// ever count versions the document really reached.
func committed(ctx context.Context) bool { return !inTransaction(ctx) }

// lookup returns the highest version seen of the document, whether it was
// seen at all, and the write ids that the next write may remove: those of
// this repository's finished writes, and those recorded more than history
// versions below a version the document was seen at (a write whose reply
// was lost can still be told from them only until then; see the package
// documentation).
func (c *docCache) lookup(key string, history int) (ver int64, ok bool, prune []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.docs[key]
	if s == nil {
		return 0, false, nil
	}
	for k, e := range s.writes {
		if len(prune) >= maxPrune {
			break
		}
		if e.done || e.base < s.version-int64(history) {
			prune = append(prune, k)
		}
	}
	return s.version, true, prune
}

// forget drops what is known of a document (it was deleted, or not found).
func (c *docCache) forget(key string) {
	c.mu.Lock()
	delete(c.docs, key)
	c.mu.Unlock()
}

func (c *docCache) evictLocked() {
	if len(c.docs) < maxCached {
		return
	}
	for k := range c.docs {
		delete(c.docs, k)
		return
	}
}
