package scenario

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
)

// HTTPIdentities is an Identities that also serves the switch over HTTP
// with idempotency keys: POST /users/{user}/primary, the identity as the
// body, an Idempotency-Key header. The identity scenario then runs its
// timed-out clients against it (see RetryResult).
type HTTPIdentities interface {
	Identities
	Handler() (http.Handler, error)
}

// RetryResult is what the timed-out clients of the identity scenario saw.
// Each user's client asks for a switch with a timeout shorter than the
// switch takes, so its first attempt gives up while the switch runs; it
// retries with the same Idempotency-Key until it gets an answer. Another
// request (another key) then switches the user to a third identity, and the
// first client's retry arrives once more, late: it must get its first
// answer back and change nothing.
type RetryResult struct {
	// Clients is how many clients ran (one per user).
	Clients int
	// TimedOut is how many first attempts gave up before an answer;
	// Conflicts how many retries were answered 409 (the first still ran);
	// Attempts how many requests the clients sent in all.
	TimedOut, Conflicts, Attempts int
	// Replayed is how many late retries got the first answer back, marked
	// Idempotent-Replayed.
	Replayed int
	// SwitchedTwice is how many users the late retry switched back (or
	// whose late retry was not replayed): the anomaly.
	SwitchedTwice int
	// Failures holds what went wrong otherwise, one line each.
	Failures []string
}

// sequenceHeader carries a request's sequence id (see withSequence) from the
// harness's client through the service's HTTP API to its partner calls.
const sequenceHeader = "X-Switch-Sequence"

// runTimedOutClients runs one timed-out client per user against svc's HTTP
// API. ids holds each user's identities; timeout is the first attempt's.
func runTimedOutClients(ctx context.Context, svc HTTPIdentities, users *mongo.Collection, partner *Partner, ids map[string][]string, timeout time.Duration) (*RetryResult, error) {
	h, err := svc.Handler()
	if err != nil {
		return nil, err
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(withSequence(r.Context(), r.Header.Get(sequenceHeader))))
	}))
	defer srv.Close()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer hc.CloseIdleConnections()

	run := bson.NewObjectID().Hex() // keys unique to this run
	res := &RetryResult{Clients: len(ids)}
	var timedOut, conflicts, attempts, replayed, twice atomic.Int64
	failures := make([]string, len(ids))
	names := make([]string, 0, len(ids))
	for u := range ids {
		names = append(names, u)
	}
	forEach(len(names), 0, startProgress(nil, "", len(names)), func(i int) {
		user := names[i]
		post := func(key, identity string, limit time.Duration) (int, http.Header, error) {
			attempts.Add(1)
			rctx, cancel := context.WithTimeout(ctx, limit)
			defer cancel()
			req, err := http.NewRequestWithContext(rctx, http.MethodPost, srv.URL+"/users/"+user+"/primary", strings.NewReader(identity))
			if err != nil {
				return 0, nil, err
			}
			req.Header.Set("Idempotency-Key", key)
			req.Header.Set(sequenceHeader, key)
			resp, err := hc.Do(req)
			if err != nil {
				return 0, nil, err
			}
			defer resp.Body.Close()
			_, _ = io.Copy(io.Discard, resp.Body)
			return resp.StatusCode, resp.Header, nil
		}
		// until sends key until it is answered with other than 409 or 503,
		// polling every 20ms (Retry-After is the longest the running
		// request's claim can last: an upper bound).
		until := func(key, identity string) (int, http.Header, error) {
			for {
				status, header, err := post(key, identity, 30*time.Second)
				switch {
				case err != nil:
					return 0, nil, err
				case status == http.StatusConflict:
					conflicts.Add(1)
				case status != http.StatusServiceUnavailable:
					return status, header, nil
				}
				select {
				case <-ctx.Done():
					return 0, nil, ctx.Err()
				case <-time.After(20 * time.Millisecond):
				}
			}
		}
		var u struct {
			Primary string `bson:"primary"`
		}
		if err := users.FindOne(ctx, bson.D{{Key: "_id", Value: user}}).Decode(&u); err != nil {
			failures[i] = fmt.Sprintf("%s: read: %v", user, err)
			return
		}
		var others []string
		for _, id := range ids[user] {
			if id != u.Primary {
				others = append(others, id)
			}
		}
		if len(others) < 2 {
			failures[i] = user + ": needs three identities"
			return
		}
		first, second := others[0], others[1]
		key := run + "-" + user + "-switch-1"

		_, _, err := post(key, first, timeout)
		if errors.Is(err, context.DeadlineExceeded) {
			timedOut.Add(1)
		}
		if status, _, err := until(key, first); err != nil || status != http.StatusOK {
			failures[i] = fmt.Sprintf("%s: retry of the first switch: %d %v", user, status, err)
			return
		}
		if status, _, err := until(run+"-"+user+"-switch-2", second); err != nil || status != http.StatusOK {
			failures[i] = fmt.Sprintf("%s: second switch: %d %v", user, status, err)
			return
		}
		status, header, err := until(key, first) // the late retry
		if err != nil || status != http.StatusOK {
			failures[i] = fmt.Sprintf("%s: late retry: %d %v", user, status, err)
			return
		}
		ok := header.Get("Idempotent-Replayed") == "true"
		if ok {
			replayed.Add(1)
		}
		if err := users.FindOne(ctx, bson.D{{Key: "_id", Value: user}}).Decode(&u); err != nil {
			failures[i] = fmt.Sprintf("%s: read: %v", user, err)
			return
		}
		if prim := partner.Primaries(user); !ok || u.Primary != second || len(prim) != 1 || prim[0] != second {
			twice.Add(1)
		}
	})
	res.TimedOut, res.Conflicts, res.Attempts = int(timedOut.Load()), int(conflicts.Load()), int(attempts.Load())
	res.Replayed, res.SwitchedTwice = int(replayed.Load()), int(twice.Load())
	for _, f := range failures {
		if f != "" {
			res.Failures = append(res.Failures, f)
		}
	}
	return res, nil
}

// details returns the result's lines for the table.
func (r *RetryResult) details() []string {
	lines := make([]string, 0, 1+len(r.Failures))
	lines = append(lines, fmt.Sprintf("clients that retried with their Idempotency-Key after a timeout: %d (%d first attempts timed out, %d retries answered 409 while the switch ran, %d requests in all); late retries after another switch, replayed: %d of %d; switched twice: %d",
		r.Clients, r.TimedOut, r.Conflicts, r.Attempts, r.Replayed, r.Clients, r.SwitchedTwice))
	for _, f := range r.Failures {
		lines = append(lines, "timed-out client: "+f)
	}
	return lines
}
