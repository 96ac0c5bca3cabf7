package versioned

import (
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// maxCached bounds the documents a repository remembers.
const maxCached = 4096

// seen is what a repository last observed of one document. Safety never
// depends on it: every value taken from it goes into a write's filter, so a
// stale one makes the write match nothing (and the repository re-reads),
// never apply where it should not; and a write whose version names its
// incarnation needs nothing from it. It saves round trips: Guarded takes its
// anchor from it instead of reading first. Delete takes from it the
// incarnation of the version it deletes, when it saw that version, which
// lets it settle a lost reply exactly instead of answering unknown.
type seen struct {
	version int64
	inc     string // the incarnation id ("" for none)
	last    string // the id of the last write seen in the document ("" for none)
}

// docCache remembers, per document id, the last observation. It is safe
// for concurrent use and forgets an arbitrary document when full.
type docCache struct {
	mu   sync.Mutex
	docs map[string]seen
}

func newDocCache() *docCache { return &docCache{docs: map[string]seen{}} }

// cacheKey identifies a document by the BSON encoding of its id.
func cacheKey(id bson.RawValue) string {
	return string(rune(id.Type)) + string(id.Value)
}

// observe records a stored document as read. An observation of the same
// incarnation at an older version than the one held is ignored.
func (c *docCache) observe(key string, st *docState) {
	c.put(key, seen{version: st.version, inc: st.inc, last: st.last()})
}

// put records s unless it is older than what is held of the same
// incarnation.
func (c *docCache) put(key string, s seen) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok := c.docs[key]
	if ok && old.inc == s.inc && old.version > s.version {
		return
	}
	if !ok && len(c.docs) >= maxCached {
		for k := range c.docs {
			delete(c.docs, k)
			break
		}
	}
	c.docs[key] = s
}

// lookup returns what was last seen of the document, if anything.
func (c *docCache) lookup(key string) (seen, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.docs[key]
	return s, ok
}

// forget drops what is known of a document (it was deleted, or not found).
func (c *docCache) forget(key string) {
	c.mu.Lock()
	delete(c.docs, key)
	c.mu.Unlock()
}
