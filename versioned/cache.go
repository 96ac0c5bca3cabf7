package versioned

import (
	"slices"
	"sync"
	"time"
)

// maxCached bounds the documents a repository remembers.
const maxCached = 4096

// seen is what a repository last observed of one document. Every value
// taken from it goes into a write's filter, so a stale one makes the write
// match nothing: it only saves round trips (DESIGN.md).
type seen struct {
	version int64
	last    int64 // the id of the last write seen in the document (0 for none)
	// meta is the document's metadata at version: its incarnation (0 for
	// none), and its list of write ids if known (never changed once
	// stored), from which a write that pins the version $sets the list.
	meta
}

// seen is what st shows of its document, sharing st's bytes.
func (st *docState) seen() seen {
	return seen{version: st.version, last: st.last(), meta: st.meta}
}

// docCache remembers, per document id (unique across a sharded collection),
// the last observation and the shard-key values of the document it was
// made on. It is safe for concurrent use and forgets an arbitrary document
// when full.
type docCache struct {
	mu   sync.Mutex
	docs map[string]cached
}

// cached is one entry: what was seen, and on which shard-key values.
type cached struct {
	shard string
	hot   time.Time // when a write to it last matched nothing
	seen
}

// hotFor is how long after a conflict a document's writes expect another.
const hotFor = 5 * time.Second

func newDocCache() *docCache { return &docCache{docs: map[string]cached{}} }

// cacheID identifies a document: the BSON encoding of its id, and its
// shard-key values (shard.Values.Ident; "" without a shard key).
type cacheID struct{ id, shard string }

// cacheKey identifies the document key names.
func cacheKey(key docKey) cacheID {
	return cacheID{id: string(rune(key.ID.Type)) + string(key.ID.Value), shard: key.Shard.Ident()}
}

// observe records a stored document as read. An observation of the same
// incarnation at an older version than the one held is ignored.
func (c *docCache) observe(key cacheID, st *docState) {
	s := st.seen()
	s.ids, s.unfit.Value = slices.Clone(s.ids), slices.Clone(s.unfit.Value)
	c.put(key, s)
}

// put records s unless it is older than what is held of the same
// incarnation.
func (c *docCache) put(key cacheID, s seen) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok := c.docs[key.id]
	if ok && old.shard == key.shard && old.inc == s.inc && old.version > s.version {
		return
	}
	if !ok && len(c.docs) >= maxCached {
		for k := range c.docs {
			delete(c.docs, k)
			break
		}
	}
	var hot time.Time
	if ok && old.shard == key.shard {
		hot = old.hot
	}
	c.docs[key.id] = cached{shard: key.shard, hot: hot, seen: s}
}

// conflicted records that a write to the document matched nothing.
func (c *docCache) conflicted(key cacheID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.docs[key.id]; ok && e.shard == key.shard {
		e.hot = time.Now()
		c.docs[key.id] = e
	}
}

// hot reports whether a write to the document matched nothing within hotFor.
func (c *docCache) hot(key cacheID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.docs[key.id]
	return ok && e.shard == key.shard && time.Since(e.hot) < hotFor
}

// lookup returns what was last seen of the document, if anything.
func (c *docCache) lookup(key cacheID) (seen, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.docs[key.id]
	if !ok || e.shard != key.shard {
		return seen{}, false
	}
	return e.seen, true
}

// forget drops what is known of a document (it was deleted, or not found).
func (c *docCache) forget(key cacheID) {
	c.mu.Lock()
	if e, ok := c.docs[key.id]; ok && e.shard == key.shard {
		delete(c.docs, key.id)
	}
	c.mu.Unlock()
}

// shardOf returns the shard-key values (their Ident) of the document with
// key's id as last seen, if it was.
func (c *docCache) shardOf(key cacheID) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.docs[key.id]
	return e.shard, ok
}
