package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mongocas/mongocas/retry"
)

// The fake partner identity provider (an Auth0-like API) keeps, for each
// user, a set of linked identities: one primary and the secondaries linked
// to it. Promoting identity T over primary P is two calls that the partner
// cannot make atomic: unlink T from P, then link P (and its secondaries)
// under T. Two switches for the same user that interleave their calls leave
// the user with two primaries, or with a primary the local database does not
// know: the silent corruption of seed 002.
//
// The partner detects what it can: it logs every call with the caller's
// sequence id (one per switch) and counts sequences of the same user whose
// calls overlap in time, it rejects a fencing token older than one it has
// seen for the user, and it answers a repeated idempotency key with the
// stored answer instead of applying the call again.

// Header names of the partner API.
const (
	headerIdempotencyKey = "Idempotency-Key"
	headerFencingToken   = "Fencing-Token"
	headerSequence       = "X-Switch-Sequence"
)

// PartnerConfig configures the fake partner.
type PartnerConfig struct {
	// LatencyMin and LatencyMax bound the uniform delay of each call.
	// Default 20ms to 80ms.
	LatencyMin, LatencyMax time.Duration
	// FailureRate is the chance that a call answers 503: half of those
	// before applying the call, half after (a lost reply, which only an
	// idempotency key makes safe to retry). Default 0; negative means 0.
	FailureRate float64
	// Seed makes the failures and latencies repeatable.
	Seed uint64
}

// Partner is the fake identity provider, an httptest server.
type Partner struct {
	srv *httptest.Server
	cfg PartnerConfig

	mu      sync.Mutex
	rng     *rand.Rand
	users   map[string]map[string]string // user -> identity -> primary it is linked to ("" for a primary)
	fence   map[string]int64             // user -> highest fencing token seen
	replies map[string]partnerReply      // idempotency key -> first answer
	calls   []partnerCall

	failed   atomic.Int64 // 503s answered
	replayed atomic.Int64 // answers replayed for a repeated idempotency key
	stale    atomic.Int64 // calls rejected for a stale fencing token
}

type partnerReply struct {
	status int
	body   string
}

type partnerCall struct {
	user, seq, op string
	start, end    time.Time
}

// partnerAnswer is the body of a successful answer.
type partnerAnswer struct {
	Result string `json:"result"`
}

// partnerRequest is the body of unlink and link.
type partnerRequest struct {
	Primary   string `json:"primary"`
	Secondary string `json:"secondary"`
}

// NewPartner starts the fake partner. Close it when done.
func NewPartner(cfg PartnerConfig) *Partner {
	if cfg.LatencyMin <= 0 && cfg.LatencyMax <= 0 {
		cfg.LatencyMin, cfg.LatencyMax = 20*time.Millisecond, 80*time.Millisecond
	}
	cfg.LatencyMax = max(cfg.LatencyMax, cfg.LatencyMin)
	p := &Partner{
		cfg:     cfg,
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x1dc0ffee)),
		users:   map[string]map[string]string{},
		fence:   map[string]int64{},
		replies: map[string]partnerReply{},
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /users/{user}/unlink", func(w http.ResponseWriter, r *http.Request) { p.serve(w, r, "unlink") })
	mux.HandleFunc("POST /users/{user}/link", func(w http.ResponseWriter, r *http.Request) { p.serve(w, r, "link") })
	p.srv = httptest.NewServer(mux)
	return p
}

// Close stops the server.
func (p *Partner) Close() { p.srv.Close() }

// AddUser gives user the identities ids, the first one primary and the others
// linked to it.
func (p *Partner) AddUser(user string, ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := map[string]string{}
	for i, id := range ids {
		if i > 0 {
			m[id] = ids[0]
		}
	}
	m[ids[0]] = ""
	p.users[user] = m
}

// Primaries returns the identities of user that are primaries: exactly one
// for a sound account.
func (p *Partner) Primaries(user string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for id, parent := range p.users[user] {
		if parent == "" {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// PartnerStats is what the partner saw.
type PartnerStats struct {
	// Calls is the number of calls served (retries included).
	Calls int
	// Failed is the number of injected 503 answers.
	Failed int64
	// Replayed is the number of calls answered from the idempotency store.
	Replayed int64
	// StaleTokens is the number of calls rejected for a fencing token older
	// than one already seen for the user.
	StaleTokens int64
	// Interleaved is the number of switch sequences whose calls overlapped in
	// time with another sequence of the same user.
	Interleaved int
	// InterleavedUsers is the number of users with at least one such
	// sequence.
	InterleavedUsers int
}

// Stats counts what the partner saw. Call it once the callers are done.
func (p *Partner) Stats() PartnerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	type span struct{ start, end time.Time }
	byUser := map[string]map[string]*span{}
	for _, c := range p.calls {
		seqs := byUser[c.user]
		if seqs == nil {
			seqs = map[string]*span{}
			byUser[c.user] = seqs
		}
		s := seqs[c.seq]
		if s == nil {
			seqs[c.seq] = &span{c.start, c.end}
			continue
		}
		if c.start.Before(s.start) {
			s.start = c.start
		}
		if c.end.After(s.end) {
			s.end = c.end
		}
	}
	st := PartnerStats{Calls: len(p.calls), Failed: p.failed.Load(), Replayed: p.replayed.Load(), StaleTokens: p.stale.Load()}
	for _, seqs := range byUser {
		bad := 0
		for a, sa := range seqs {
			for b, sb := range seqs {
				if a != b && sa.start.Before(sb.end) && sb.start.Before(sa.end) {
					bad++
					break
				}
			}
		}
		st.Interleaved += bad
		if bad > 0 {
			st.InterleavedUsers++
		}
	}
	return st
}

func (p *Partner) serve(w http.ResponseWriter, r *http.Request, op string) {
	start := time.Now()
	user := r.PathValue("user")
	var req partnerRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	lat := p.cfg.LatencyMin + time.Duration(p.rng.Int64N(int64(p.cfg.LatencyMax-p.cfg.LatencyMin)+1))
	fail := p.cfg.FailureRate > 0 && p.rng.Float64() < p.cfg.FailureRate
	failAfter := p.rng.IntN(2) == 0
	p.mu.Unlock()

	select { // the partner's own latency
	case <-time.After(lat):
	case <-r.Context().Done():
		return
	}
	if fail && !failAfter {
		p.failed.Add(1)
		p.log(user, r, op, start)
		http.Error(w, "temporarily unavailable", http.StatusServiceUnavailable)
		return
	}
	status, body := p.apply(user, r, op, req)
	p.log(user, r, op, start)
	if fail {
		p.failed.Add(1)
		status, body = http.StatusServiceUnavailable, "temporarily unavailable (the call was applied)"
	}
	if status != http.StatusOK {
		http.Error(w, body, status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(partnerAnswer{Result: body}); err != nil {
		return // the caller went away
	}
}

func (p *Partner) log(user string, r *http.Request, op string, start time.Time) {
	p.mu.Lock()
	p.calls = append(p.calls, partnerCall{user: user, seq: r.Header.Get(headerSequence), op: op, start: start, end: time.Now()})
	p.mu.Unlock()
}

// apply checks the fencing token and the idempotency key, then applies op.
func (p *Partner) apply(user string, r *http.Request, op string, req partnerRequest) (int, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if tok := r.Header.Get(headerFencingToken); tok != "" {
		n, err := strconv.ParseInt(tok, 10, 64)
		if err != nil {
			return http.StatusBadRequest, "bad fencing token"
		}
		if n < p.fence[user] {
			p.stale.Add(1)
			return http.StatusConflict, fmt.Sprintf("stale fencing token %d: %d seen", n, p.fence[user])
		}
		p.fence[user] = n
	}
	key := r.Header.Get(headerIdempotencyKey)
	if key != "" {
		if rep, ok := p.replies[key]; ok {
			p.replayed.Add(1)
			return rep.status, rep.body
		}
	}
	status, body := p.applyLocked(user, op, req)
	if key != "" {
		p.replies[key] = partnerReply{status, body}
	}
	return status, body
}

func (p *Partner) applyLocked(user, op string, req partnerRequest) (int, string) {
	ids := p.users[user]
	if ids == nil {
		return http.StatusNotFound, "no such user"
	}
	parentP, okP := ids[req.Primary]
	parentS, okS := ids[req.Secondary]
	switch {
	case !okP || !okS:
		return http.StatusNotFound, "no such identity"
	case req.Primary == req.Secondary:
		return http.StatusBadRequest, "primary and secondary are the same identity"
	case parentP != "":
		return http.StatusConflict, req.Primary + " is not a primary"
	}
	switch op {
	case "unlink":
		if parentS != req.Primary {
			return http.StatusConflict, fmt.Sprintf("%s is not linked to %s", req.Secondary, req.Primary)
		}
		ids[req.Secondary] = ""
	case "link":
		if parentS != "" {
			return http.StatusConflict, req.Secondary + " is not a primary"
		}
		ids[req.Secondary] = req.Primary
		for id, parent := range ids {
			if parent == req.Secondary {
				ids[id] = req.Primary
			}
		}
	}
	return http.StatusOK, "ok"
}

// PartnerError is a partner answer other than 200. A 5xx or 429 answer is
// retryable; any other is not.
type PartnerError struct {
	// Op is "unlink" or "link".
	Op string
	// Status is the HTTP status.
	Status int
	// Body is the partner's message.
	Body string
}

func (e *PartnerError) Error() string {
	return fmt.Sprintf("partner %s: %d %s", e.Op, e.Status, bytes.TrimSpace([]byte(e.Body)))
}

// Retryable reports whether the call may pass if sent again.
func (e *PartnerError) Retryable() bool {
	return e.Status >= 500 || e.Status == http.StatusTooManyRequests
}

// transportError is a failure to reach the partner at all; retry.Do retries
// it (the idempotency key makes that safe).
type transportError struct{ err error }

func (e *transportError) Error() string   { return "partner: " + e.err.Error() }
func (e *transportError) Unwrap() error   { return e.err }
func (e *transportError) Retryable() bool { return true }

// PartnerClient calls the partner, retrying 5xx answers and transport
// failures with the retry package.
type PartnerClient struct {
	base    string
	hc      *http.Client
	policy  retry.Policy
	retries atomic.Int64
}

// partnerAttemptTimeout bounds one call to the partner.
const partnerAttemptTimeout = 2 * time.Second

// Client returns a client of p whose retries follow policy (OnRetry is
// replaced, to count retries).
func (p *Partner) Client(policy retry.Policy) *PartnerClient {
	c := &PartnerClient{
		base: p.srv.URL,
		hc:   &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}},
	}
	policy.OnRetry = func(retry.Attempt) { c.retries.Add(1) }
	c.policy = policy
	return c
}

// Close closes idle connections.
func (c *PartnerClient) Close() { c.hc.CloseIdleConnections() }

// Retries returns how many calls were retried.
func (c *PartnerClient) Retries() int64 { return c.retries.Load() }

// call is one partner call. seq identifies the switch it belongs to, key is
// the idempotency key (stable across the retries of the call) and token the
// fencing token (0: none).
type call struct {
	op, user, primary, secondary string
	seq, key                     string
	token                        int64
}

// Do sends the call, retrying as the policy allows.
func (c *PartnerClient) Do(ctx context.Context, k call) error {
	body, err := json.Marshal(partnerRequest{Primary: k.primary, Secondary: k.secondary})
	if err != nil {
		return err
	}
	return retry.Do(ctx, c.policy, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, partnerAttemptTimeout)
		defer cancel()
		req, err := http.NewRequestWithContext(actx, http.MethodPost, c.base+"/users/"+k.user+"/"+k.op, bytes.NewReader(body))
		if err != nil {
			return retry.Permanent(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(headerSequence, k.seq)
		if k.key != "" {
			req.Header.Set(headerIdempotencyKey, k.key)
		}
		if k.token != 0 {
			req.Header.Set(headerFencingToken, strconv.FormatInt(k.token, 10))
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			return &transportError{err}
		}
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<12))
		if resp.StatusCode != http.StatusOK {
			return &PartnerError{Op: k.op, Status: resp.StatusCode, Body: string(msg)}
		}
		return nil
	})
}

// isPartnerConflict reports whether err is the partner refusing a call
// because the identities are not in the state the caller assumed.
func isPartnerConflict(err error) bool {
	var pe *PartnerError
	return errors.As(err, &pe) && pe.Status == http.StatusConflict
}

// SwitchPrimary makes the two partner calls that promote identity to
// primary over from, the user's primary now: unlink it, then link the others
// under it. key prefixes the calls' idempotency keys; token, when not 0, is
// the fencing token. Nothing is sent when identity is already primary. The
// switch's sequence id, for the partner's interleaving detection, comes from
// ctx (see withSequence).
func (c *PartnerClient) SwitchPrimary(ctx context.Context, user, from, identity, key string, token int64) error {
	if identity == from {
		return nil
	}
	seq := sequence(ctx)
	if err := c.Do(ctx, call{op: "unlink", user: user, primary: from, secondary: identity, seq: seq, key: key + "/unlink", token: token}); err != nil {
		return err
	}
	return c.Do(ctx, call{op: "link", user: user, primary: identity, secondary: from, seq: seq, key: key + "/link", token: token})
}

// sequenceKey is the context key of a switch's sequence id.
type sequenceKey struct{}

// withSequence returns ctx carrying seq, the id the partner logs with each
// call of one switch to tell switches apart. It travels in the context so
// that the code under test (the program's own service) need not know it.
func withSequence(ctx context.Context, seq string) context.Context {
	return context.WithValue(ctx, sequenceKey{}, seq)
}

// sequence returns the sequence id withSequence put in ctx, or "".
func sequence(ctx context.Context) string {
	s, _ := ctx.Value(sequenceKey{}).(string)
	return s
}
