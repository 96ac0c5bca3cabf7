package mongotest_test

import (
	"context"
	"testing"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

func TestMain(m *testing.M) { mongotest.Main(m) }

func TestSmoke(t *testing.T) {
	db := mongotest.New(t)
	t.Logf("backend=%s uri=%s caps=%s", db.Server.Backend, db.Server.URI, db.Caps())
	c := store.NewClock(store.HelloSampler(db.Client()), nil)
	e, err := c.Now(context.Background())
	t.Logf("clock %+v err %v", e, err)
}
