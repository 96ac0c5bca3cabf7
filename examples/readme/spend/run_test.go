package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/mongocas/mongocas/deferred"
	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/retry"
	"github.com/mongocas/mongocas/versioned"
)

func TestMain(m *testing.M) { mongotest.Main(m) }

// TestService: a change applies now (200); when another instance writes
// the wallet between Modify's read and its write and the retries (one
// attempt here) run out, it is queued (202 with the job) and applied later,
// once; a change the balance does not cover is 402, an unknown wallet 404.
func TestService(t *testing.T) {
	db := mongotest.New(t)
	ctx := t.Context()
	f := db.Faulty(t, nil) // this instance's client
	wallets, err := versioned.New[Wallet](f.Collection("wallets"), &versioned.Options{Retry: retry.Policy{MaxAttempts: 1}})
	require.NoError(t, err)
	_, jobs, err := open(f.Database)
	require.NoError(t, err)
	handler, err := NewService(wallets, jobs)
	require.NoError(t, err)
	other, err := versioned.New[Wallet](db.Collection("wallets"), nil) // another instance's
	require.NoError(t, err)
	require.NoError(t, wallets.Insert(ctx, &Wallet{ID: "ana", Balance: 100}))
	serve := func(method, target string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, method, target, nil))
		return rec
	}

	rec := serve(http.MethodPost, "/wallets/ana/spend?amount=10")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	require.JSONEq(t, `{"id":"ana","balance":90}`, rec.Body.String())

	var once sync.Once
	writes := mongotest.Writes("wallets")
	f.ErrorBeforeApply(func(c *mongotest.Command) bool {
		if writes(c) {
			once.Do(func() {
				_, err := other.Modify(ctx, "ana", func(w *Wallet) error { w.Balance -= 5; return nil })
				require.NoError(t, err)
			})
		}
		return false // the write goes on, and meets the other's version
	}, mongotest.ServerError{})
	rec = serve(http.MethodPost, "/wallets/ana/spend?amount=20")
	require.Equal(t, http.StatusAccepted, rec.Code, rec.Body.String())
	loc := rec.Header().Get("Location")
	require.True(t, strings.HasPrefix(loc, "/jobs/"), loc)
	id, err := bson.ObjectIDFromHex(strings.TrimPrefix(loc, "/jobs/"))
	require.NoError(t, err)

	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = jobs.Run(runCtx) })
	defer func() { stop(); wg.Wait() }()
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	job, err := jobs.Wait(waitCtx, id, 20*time.Millisecond) // polls every 20 ms until the job ends
	require.NoError(t, err)
	require.Equal(t, deferred.StateCompleted, job.State)
	require.Contains(t, serve(http.MethodGet, loc).Body.String(), `"state":"completed"`)
	w, err := other.Get(ctx, "ana")
	require.NoError(t, err)
	require.Equal(t, int64(100-10-5-20), w.Balance, "the queued change applied once")

	require.Equal(t, http.StatusPaymentRequired, serve(http.MethodPost, "/wallets/ana/spend?amount=1000").Code)
	require.Equal(t, http.StatusNotFound, serve(http.MethodPost, "/wallets/bob/spend?amount=1").Code)
	require.Equal(t, http.StatusBadRequest, serve(http.MethodPost, "/wallets/ana/spend?amount=x").Code)
}

// TestServeStopsWhenCancelled: the program's server comes up on its
// database, answers HTTP, and returns nil once its context ends (Ctrl-C),
// so main stops the server it started.
func TestServeStopsWhenCancelled(t *testing.T) {
	db := mongotest.New(t)
	var lc net.ListenConfig
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- serve(ctx, db.Server.URI, addr) }()
	require.Eventually(t, func() bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
		if err != nil {
			return false
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusNotFound
	}, time.Minute, 20*time.Millisecond, "the server answers")
	cancel() // Ctrl-C
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("serve did not return after its context ended")
	}
}
