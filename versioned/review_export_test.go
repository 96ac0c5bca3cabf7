package versioned

import (
	"strconv"

	"github.com/mongocas/mongocas/store"
)

// EvictUntilForgotten records other documents in r's cache, as serving them
// would, until the cache has forgotten id (a full cache forgets an
// arbitrary entry), and returns how many it recorded.
func EvictUntilForgotten[T any](r *Repo[T], id any) int {
	raw, err := store.CheckID(id)
	if err != nil {
		panic(err)
	}
	k := cacheKey(raw)
	n := 0
	for ; ; n++ {
		if _, ok := r.cache.lookup(k); !ok {
			return n
		}
		r.cache.put("other-"+strconv.Itoa(n), seen{version: 1, inc: "x", last: "x"})
	}
}
