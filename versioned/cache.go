package versioned

import (
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// maxCached bounds the documents a repository remembers.
const maxCached = 4096

// seen is what a repository last observed of one document: the highest
// version it saw and the write ids that observation carried. It serves two
// purposes only, neither of which correctness depends on: Guarded takes its
// base version from it instead of reading first, and writes that do not
// read (Update, Guarded) prune the old write ids it lists.
type seen struct {
	version int64
	writes  map[string]int64
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

// observe records a stored document read at version ver. Observations older
// than the one held are ignored.
func (c *docCache) observe(key string, ver int64, writes bson.Raw) {
	elems, _ := writes.Elements()
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.docs[key]
	if s != nil && s.version > ver {
		return
	}
	if s == nil {
		c.evictLocked()
		s = &seen{}
		c.docs[key] = s
	}
	s.version = ver
	s.writes = make(map[string]int64, len(elems))
	for _, e := range elems {
		if v, ok := entryVersion(e.Value()); ok {
			s.writes[e.Key()] = v
		}
	}
}

// wrote records a write of ours that landed: the document is at least at
// version ver, carries write id wid (recorded with base) and no longer
// carries the pruned ids.
func (c *docCache) wrote(key string, ver int64, wid string, base int64, pruned []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.docs[key]
	if s == nil {
		c.evictLocked()
		s = &seen{writes: map[string]int64{}}
		c.docs[key] = s
	}
	s.version = max(s.version, ver)
	for _, k := range pruned {
		delete(s.writes, k)
	}
	s.writes[wid] = base
}

// lookup returns the highest version seen of the document and the write
// ids that a write at version base or later may prune.
func (c *docCache) lookup(key string, history int) (ver int64, ok bool, prune []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.docs[key]
	if s == nil {
		return 0, false, nil
	}
	for k, v := range s.writes {
		if len(prune) >= maxPrune {
			break
		}
		if v < s.version-int64(history) {
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
