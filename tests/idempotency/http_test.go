package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/mongocas/mongocas/idempotency"
)

// serve runs h wrapped by k.Handler on a real HTTP server.
func serve(t *testing.T, k *idempotency.Keys, h http.Handler, opts *idempotency.HTTPOptions) *httptest.Server {
	t.Helper()
	wrapped, err := k.Handler(h, opts)
	require.NoError(t, err)
	srv := httptest.NewServer(wrapped)
	t.Cleanup(srv.Close)
	return srv
}

type reply struct {
	status int
	header http.Header
	body   string
}

// send makes a request with a real client. key "" sends no Idempotency-Key.
func send(t *testing.T, client *http.Client, method, url, key, body string, header ...string) reply {
	t.Helper()
	r, err := sendErr(client, method, url, key, body, header...)
	require.NoError(t, err)
	return r
}

// sendErr is send for goroutines other than the test's.
func sendErr(client *http.Client, method, url, key, body string, header ...string) (reply, error) {
	req, err := http.NewRequestWithContext(context.Background(), method, url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	if key != "" {
		req.Header.Set(idempotency.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

// problemTitle decodes a problem details body and returns its title.
func problemTitle(t *testing.T, r reply) string {
	t.Helper()
	require.Equal(t, "application/problem+json", r.header.Get("Content-Type"), r.body)
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &p), r.body)
	require.Equal(t, r.status, p.Status)
	require.Equal(t, "https://example.com/docs/idempotency", p.Type)
	return p.Title
}

// orders is a handler that creates an order per request it runs.
type orders struct {
	runs atomic.Int32
	t    *testing.T
}

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := o.runs.Add(1)
	c := idempotency.CallFrom(r.Context())
	body, _ := io.ReadAll(r.Body)
	if r.Method == http.MethodGet {
		if c != nil {
			o.t.Error("GET is not guarded, yet it has a Call")
		}
		_, _ = w.Write([]byte("list"))
		return
	}
	if c == nil {
		o.t.Error("a guarded request has no Call")
		return
	}
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"order":%d,"item":%q,"key":%q}`, n, body, c.Key())
}

// TestHTTP: the middleware through a real server and client: the first
// request runs and its response is stored; retries get it back marked
// Idempotent-Replayed; a missing or invalid key is 400; the key with another
// body or path is 422; other methods pass through; scopes separate clients.
func TestHTTP(t *testing.T) {
	b := setup(t)
	k := b.keys(t, nil, "a", nil)
	h := &orders{t: t}
	var reported atomic.Int32
	srv := serve(t, k, h, &idempotency.HTTPOptions{
		ProblemType: "https://example.com/docs/idempotency",
		Scope:       func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil },
		OnError:     func(*http.Request, error) { reported.Add(1) },
	})
	c := srv.Client()
	url := srv.URL + "/orders"

	r := send(t, c, http.MethodPost, url, "", "mug")
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Equal(t, "Idempotency-Key is missing", problemTitle(t, r))
	for _, bad := range []string{`"unterminated`, `"a" trailing`, `$where`, strings.Repeat("x", 256), "a, b"} {
		r = send(t, c, http.MethodPost, url, bad, "mug")
		require.Equal(t, http.StatusBadRequest, r.status, bad)
		require.Equal(t, "Idempotency-Key is invalid", problemTitle(t, r))
	}
	require.Zero(t, h.runs.Load())
	require.Zero(t, count(t, b.coll), "nothing stored for a refused request")

	first := send(t, c, http.MethodPost, url, "order-7f3a", "mug")
	require.Equal(t, http.StatusCreated, first.status)
	require.Equal(t, "/orders/1", first.header.Get("Location"))
	require.Empty(t, first.header.Get(idempotency.HeaderReplayed))
	require.JSONEq(t, `{"order":1,"item":"mug","key":"order-7f3a"}`, first.body)

	for _, key := range []string{"order-7f3a", `"order-7f3a"`, ` "order-7f3a"	`} {
		again := send(t, c, http.MethodPost, url, key, "mug")
		require.Equal(t, http.StatusCreated, again.status, key)
		require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed))
		require.Equal(t, "/orders/1", again.header.Get("Location"))
		require.Equal(t, "application/json", again.header.Get("Content-Type"))
		require.Equal(t, first.body, again.body)
	}
	require.Equal(t, int32(1), h.runs.Load(), "replays run nothing")

	r = send(t, c, http.MethodPost, url, "order-7f3a", "teapot")
	require.Equal(t, http.StatusUnprocessableEntity, r.status)
	require.Equal(t, "Idempotency-Key reused with a different request", problemTitle(t, r))
	r = send(t, c, http.MethodPost, srv.URL+"/refunds", "order-7f3a", "mug")
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "the path is part of the fingerprint")
	r = send(t, c, http.MethodPatch, url, "order-7f3a", "mug")
	require.Equal(t, http.StatusUnprocessableEntity, r.status, "so is the method")

	r = send(t, c, http.MethodGet, url, "order-7f3a", "")
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "list", r.body)
	require.Equal(t, int32(2), h.runs.Load())

	other := send(t, c, http.MethodPost, url, "order-7f3a", "teapot", "X-User", "bob")
	require.Equal(t, http.StatusCreated, other.status, "bob's key is not alice's")
	require.Empty(t, other.header.Get(idempotency.HeaderReplayed))
	require.Equal(t, int32(3), h.runs.Load())
	require.Zero(t, reported.Load())
}

// TestHTTPTransient: a 5xx response is sent but not stored, so the retry
// runs the handler again; a final 4xx is stored. A response larger than
// MaxResponseBody is sent, not stored, and reported. A request body larger
// than MaxRequestBody is 413 and runs nothing.
func TestHTTPTransient(t *testing.T) {
	b := setup(t)
	k := b.keys(t, nil, "a", nil)
	var runs atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		switch {
		case r.URL.Path == "/big":
			_, _ = w.Write([]byte(strings.Repeat("b", 100)))
		case n == 1:
			http.Error(w, "partner timed out", http.StatusBadGateway)
		default:
			http.Error(w, "card declined", http.StatusPaymentRequired)
		}
	})
	var (
		mu       sync.Mutex
		reported []error
	)
	srv := serve(t, k, h, &idempotency.HTTPOptions{
		MaxRequestBody:  10,
		MaxResponseBody: 50,
		OnError: func(_ *http.Request, err error) {
			mu.Lock()
			defer mu.Unlock()
			reported = append(reported, err)
		},
	})
	c := srv.Client()

	r := send(t, c, http.MethodPost, srv.URL+"/pay", "p-1", "10 EUR")
	require.Equal(t, http.StatusBadGateway, r.status)
	require.Empty(t, r.header.Get(idempotency.HeaderReplayed))
	r = send(t, c, http.MethodPost, srv.URL+"/pay", "p-1", "10 EUR")
	require.Equal(t, http.StatusPaymentRequired, r.status, "the 502 was not stored: the retry ran")
	require.Empty(t, r.header.Get(idempotency.HeaderReplayed))
	r = send(t, c, http.MethodPost, srv.URL+"/pay", "p-1", "10 EUR")
	require.Equal(t, http.StatusPaymentRequired, r.status)
	require.Equal(t, "true", r.header.Get(idempotency.HeaderReplayed), "a 402 is final")
	require.Equal(t, "card declined\n", r.body)
	require.Equal(t, int32(2), runs.Load())

	r = send(t, c, http.MethodPost, srv.URL+"/pay", "p-2", "far more than ten bytes")
	require.Equal(t, http.StatusRequestEntityTooLarge, r.status)
	require.Equal(t, int32(2), runs.Load())

	for range 2 {
		r = send(t, c, http.MethodPost, srv.URL+"/big", "p-3", "")
		require.Equal(t, http.StatusOK, r.status)
		require.Len(t, r.body, 100)
		require.Empty(t, r.header.Get(idempotency.HeaderReplayed))
	}
	require.Equal(t, int32(4), runs.Load(), "too large to store: each retry runs")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, reported, 2)
	require.Contains(t, reported[0].Error(), "larger than MaxResponseBody")
}

// TestHTTPConcurrent: 50 clients send one request with one key at once.
// The handler runs once and waits until the 49 others were answered 409
// Conflict with a Retry-After; it then answers, and each of the 49 retries
// and gets its response, replayed.
func TestHTTPConcurrent(t *testing.T) {
	const n = 50
	b := setup(t)
	// The handler holds the key until 49 requests were answered: on a
	// loaded 2-core machine that took over a minute once, and a 2 s TTL
	// whose renewals fell behind let a second request run (the lease's
	// documented behaviour, not what this test checks).
	const ttl = 10 * time.Second
	k := b.keys(t, nil, "a", &idempotency.Options{TTL: ttl})
	var (
		runs      atomic.Int32
		conflicts atomic.Int32
		allDone   = make(chan struct{})
		answered  = make(chan struct{})
	)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		select {
		case <-allDone:
		case <-r.Context().Done():
			http.Error(w, "gave up", http.StatusServiceUnavailable)
			return
		case <-time.After(time.Minute):
			http.Error(w, "the others never got their 409", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("switched primary identity"))
	})
	srv := serve(t, k, h, nil)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	t.Cleanup(client.CloseIdleConnections)

	firsts := make([]reply, n)
	retries := make([]reply, n)
	errs := make([]error, 2*n)
	var wg sync.WaitGroup
	var once sync.Once
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			firsts[i], errs[i] = sendErr(client, http.MethodPost, srv.URL+"/identity/primary", "switch-9", "identity-b")
			if firsts[i].status != http.StatusConflict {
				once.Do(func() { close(answered) })
				return
			}
			if conflicts.Add(1) == n-1 {
				close(allDone)
			}
			<-answered
			retries[i], errs[n+i] = sendErr(client, http.MethodPost, srv.URL+"/identity/primary", "switch-9", "identity-b")
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}

	require.Equal(t, int32(1), runs.Load())
	require.Equal(t, int32(n-1), conflicts.Load())
	for i := range n {
		if firsts[i].status != http.StatusConflict {
			require.Equal(t, http.StatusOK, firsts[i].status)
			require.Equal(t, "switched primary identity", firsts[i].body)
			continue
		}
		secs, err := strconv.Atoi(firsts[i].header.Get("Retry-After"))
		require.NoError(t, err, "Retry-After in whole seconds")
		require.GreaterOrEqual(t, secs, 1)
		require.LessOrEqual(t, secs, int(ttl/time.Second), "at most the claim's TTL")
		require.Equal(t, http.StatusOK, retries[i].status)
		require.Equal(t, "true", retries[i].header.Get(idempotency.HeaderReplayed))
		require.Equal(t, "switched primary identity", retries[i].body)
	}
}

// TestHTTPRetryAfter: a client that honours Retry-After gets the result of
// the request it retried once the first one finished.
func TestHTTPRetryAfter(t *testing.T) {
	b := setup(t)
	k := b.keys(t, nil, "a", &idempotency.Options{TTL: 2 * time.Second})
	entered := make(chan struct{})
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(entered)
		<-release
		_, _ = w.Write([]byte("done"))
	})
	srv := serve(t, k, h, nil)
	c := srv.Client()
	var (
		first    reply
		firstErr error
		wg       sync.WaitGroup
	)
	wg.Go(func() { first, firstErr = sendErr(c, http.MethodPost, srv.URL, "slow", "x") })
	<-entered
	r := send(t, c, http.MethodPost, srv.URL, "slow", "x")
	require.Equal(t, http.StatusConflict, r.status)
	secs, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err)
	close(release)
	wg.Wait()
	require.NoError(t, firstErr)
	require.Equal(t, "done", first.body)
	time.Sleep(time.Duration(secs) * time.Second)
	r = send(t, c, http.MethodPost, srv.URL, "slow", "x")
	require.Equal(t, http.StatusOK, r.status)
	require.Equal(t, "true", r.header.Get(idempotency.HeaderReplayed))
	require.Equal(t, "done", r.body)
}

// TestHTTPRecorder: what the middleware records is what the handler sent:
// nothing written is 200 with no body; a body without a Content-Type gets
// the sniffed one; the header as it was at WriteHeader (later changes are
// not sent, as net/http does); Date is not stored but sent afresh.
func TestHTTPRecorder(t *testing.T) {
	b := setup(t)
	k := b.keys(t, nil, "a", nil)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/empty":
		case "/sniff":
			_, _ = w.Write([]byte("<html><body>hi</body></html>"))
		case "/late":
			w.Header().Set("X-Before", "1")
			w.WriteHeader(http.StatusAccepted)
			w.Header().Set("X-After", "1")
			_, _ = w.Write([]byte("accepted"))
		}
	})
	srv := serve(t, k, h, nil)
	c := srv.Client()
	for _, path := range []string{"/empty", "/sniff", "/late"} {
		first := send(t, c, http.MethodPost, srv.URL+path, "k"+path, "")
		again := send(t, c, http.MethodPost, srv.URL+path, "k"+path, "")
		require.Equal(t, "true", again.header.Get(idempotency.HeaderReplayed), path)
		require.Equal(t, first.status, again.status, path)
		require.Equal(t, first.body, again.body, path)
		require.Equal(t, first.header.Get("Content-Type"), again.header.Get("Content-Type"), path)
		require.NotEmpty(t, again.header.Get("Date"), path)
		switch path {
		case "/empty":
			require.Equal(t, http.StatusOK, first.status)
			require.Empty(t, first.body)
		case "/sniff":
			require.Equal(t, "text/html; charset=utf-8", first.header.Get("Content-Type"))
		case "/late":
			require.Equal(t, http.StatusAccepted, first.status)
			require.Equal(t, "1", again.header.Get("X-Before"))
			require.Empty(t, first.header.Get("X-After"))
			require.Empty(t, again.header.Get("X-After"))
		}
	}
	rec := load(t, b.coll, "k/late")
	require.NotNil(t, rec.Result)
	raw, err := b.coll.FindOne(context.Background(), map[string]string{"_id": "k/late"}).Raw()
	require.NoError(t, err)
	require.NotContains(t, raw.String(), `"Date"`, "Date is not stored")
}
