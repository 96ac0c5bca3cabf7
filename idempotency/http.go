package idempotency

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Header field names.
const (
	// HeaderKey is the request header that carries the idempotency key.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is "true" on a replayed response (as Stripe does).
	HeaderReplayed = "Idempotent-Replayed"
)

// Defaults of the HTTPOptions fields.
const (
	// DefaultMaxRequestBody is the largest request body the handler reads.
	DefaultMaxRequestBody = 1 << 20
	// DefaultMaxResponseBody is the largest response body the handler stores.
	DefaultMaxResponseBody = 4 << 20
)

// HTTPOptions configures [Keys.Handler]. A nil *HTTPOptions means all
// defaults; every zero field takes its default.
type HTTPOptions struct {
	// Methods are the methods whose requests go through the key store;
	// others are passed to the handler untouched. Default POST and PATCH.
	Methods []string

	// Optional lets a request without an Idempotency-Key through to the
	// handler, unprotected. By default it is answered 400 Bad Request.
	Optional bool

	// Scope returns the scope of the request's key (the authenticated user,
	// API key or tenant), so that two clients' keys never meet. Default: one
	// scope for every request. An error is answered 400.
	Scope func(r *http.Request) (string, error)

	// Fingerprint returns what identifies the request's content, given the
	// request and its body (already read; r.Body reads it again): another
	// fingerprint than the first request's gets 422. Default
	// DefaultFingerprint. An error is answered 400.
	Fingerprint func(r *http.Request, body []byte) ([]byte, error)

	// Final reports whether a response with this status is final: stored
	// and replayed to every retry. Others are sent once and not stored: a
	// retry runs the handler again, from its last checkpoint. Default: every
	// status except 5xx, 408 and 429.
	Final func(status int) bool

	// MaxRequestBody is the largest request body read for the fingerprint;
	// a larger one is answered 413 and nothing runs. Default 1 MiB.
	MaxRequestBody int64

	// MaxResponseBody is the largest response body stored; a larger final
	// response is sent, not stored, and OnError is told. Default 4 MiB (a
	// record holds at most 16 MiB).
	MaxResponseBody int

	// ProblemType is the "type" of the problem details (RFC 9457) sent with
	// the handler's own answers (400, 409, 413, 422, 503): a URI of the
	// service's documentation on idempotency keys. Default "about:blank".
	ProblemType string

	// OnError, if set, is told of failures the client does not see in full:
	// a result that could not be stored (the response was sent all the
	// same), the store errors behind a 503. It must not block for long.
	OnError func(r *http.Request, err error)
}

// DefaultFingerprint is the default fingerprint of a request: a SHA-256 of
// its method, path, query and body.
func DefaultFingerprint(r *http.Request, body []byte) ([]byte, error) {
	h := sha256.New()
	bodySum := sha256.Sum256(body)
	fmt.Fprintf(h, "%s\n%s\n%s\n%x", r.Method, r.URL.EscapedPath(), r.URL.RawQuery, bodySum)
	return h.Sum(nil), nil
}

type handler struct {
	k    *Keys
	next http.Handler
	o    HTTPOptions
}

// Handler wraps next so that requests with an Idempotency-Key header run at
// most once per claim of the key and their retries get the first response:
//
//   - the first request with a key runs next and stores its response if it
//     is final (HTTPOptions.Final): status, header fields and body;
//   - a retry with the same key and fingerprint gets the stored response,
//     with Idempotent-Replayed: true, and next does not run;
//   - while another request with the key runs: 409 Conflict, Retry-After the
//     longest its claim can last without a renewal (whole seconds);
//   - the same key with another fingerprint: 422 Unprocessable Content;
//   - no key (unless Optional), or an invalid one: 400 Bad Request;
//   - the store failing before next ran: 503 Service Unavailable.
//
// These answers carry problem details (RFC 9457). next finds the run's *Call
// with [CallFrom] on the request's context, which ends if the claim is lost;
// its response is buffered and sent when it returns. Handler fails only for
// invalid options.
func (k *Keys) Handler(next http.Handler, opts *HTTPOptions) (http.Handler, error) {
	if next == nil {
		return nil, &OptionsError{Field: "next", Reason: "is nil"}
	}
	var o HTTPOptions
	if opts != nil {
		o = *opts
	}
	if o.Methods == nil {
		o.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if o.Fingerprint == nil {
		o.Fingerprint = DefaultFingerprint
	}
	if o.Final == nil {
		o.Final = func(status int) bool {
			return status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
		}
	}
	switch {
	case o.MaxRequestBody < 0:
		return nil, &OptionsError{Field: "MaxRequestBody", Reason: "is negative"}
	case o.MaxResponseBody < 0:
		return nil, &OptionsError{Field: "MaxResponseBody", Reason: "is negative"}
	}
	o.MaxRequestBody = cmp.Or(o.MaxRequestBody, DefaultMaxRequestBody)
	o.MaxResponseBody = cmp.Or(o.MaxResponseBody, DefaultMaxResponseBody)
	o.ProblemType = cmp.Or(o.ProblemType, "about:blank")
	if o.OnError == nil {
		o.OnError = func(*http.Request, error) {}
	}
	return &handler{k: k, next: next, o: o}, nil
}

type callKey struct{}

// CallFrom returns the *Call of the request whose context is ctx, inside a
// handler wrapped by [Keys.Handler], or nil if the request carries no key.
func CallFrom(ctx context.Context) *Call {
	c, _ := ctx.Value(callKey{}).(*Call)
	return c
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(h.o.Methods, r.Method) {
		h.next.ServeHTTP(w, r)
		return
	}
	key, err := ParseHeader(r.Header.Values(HeaderKey))
	switch {
	case err != nil:
		h.problem(w, http.StatusBadRequest, "Idempotency-Key is invalid", err.Error(), 0)
		return
	case key == "" && h.o.Optional:
		h.next.ServeHTTP(w, r)
		return
	case key == "":
		h.problem(w, http.StatusBadRequest, "Idempotency-Key is missing", "This operation requires an Idempotency-Key header: a unique value per operation, the same for its retries.", 0)
		return
	}
	scope := ""
	if h.o.Scope != nil {
		if scope, err = h.o.Scope(r); err != nil {
			h.problem(w, http.StatusBadRequest, "The request's scope is invalid", err.Error(), 0)
			return
		}
	}
	ref, err := newRef(scope, key)
	if err != nil {
		h.problem(w, http.StatusBadRequest, "Idempotency-Key is invalid", err.Error(), 0)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.o.MaxRequestBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			h.problem(w, http.StatusRequestEntityTooLarge, "Request body too large", fmt.Sprintf("A request with an Idempotency-Key may carry at most %d bytes.", h.o.MaxRequestBody), 0)
			return
		}
		h.problem(w, http.StatusBadRequest, "Unreadable request body", err.Error(), 0)
		return
	}
	fp, err := h.o.Fingerprint(r, body)
	if err != nil {
		h.problem(w, http.StatusBadRequest, "The request cannot be fingerprinted", err.Error(), 0)
		return
	}

	res, err := h.k.do(r.Context(), ref, digest(fp),
		func(ctx context.Context, c *Call) (Result, bool, error) {
			rec := &recorder{w: w, header: make(http.Header)}
			req := r.WithContext(context.WithValue(ctx, callKey{}, c))
			req.Body = io.NopCloser(bytes.NewReader(body))
			h.next.ServeHTTP(rec, req)
			out := rec.result()
			final := h.o.Final(out.Status)
			if final && len(out.Body) > h.o.MaxResponseBody {
				final = false
				h.o.OnError(r, fmt.Errorf("idempotency: key %s: a response body of %d bytes is larger than MaxResponseBody (%d): sent, not stored", quoteKey(key), len(out.Body), h.o.MaxResponseBody))
			}
			return out, final, nil
		})
	var (
		inProgress *InProgressError
		mismatch   *MismatchError
	)
	switch {
	case err == nil:
		writeResult(w, res, res.Replayed)
	case errors.As(err, &inProgress):
		h.problem(w, http.StatusConflict, "A request with this Idempotency-Key is in progress",
			"Retry after the time in Retry-After; you will then get this request's result.",
			max(1, int64(math.Ceil(inProgress.TimeLeft.Seconds()))))
	case errors.As(err, &mismatch):
		h.problem(w, http.StatusUnprocessableEntity, "Idempotency-Key reused with a different request",
			"This key was first used with a request of other content (method, target or body). Use a new key for a new request.", 0)
	case errors.Is(err, ErrInvalid):
		h.problem(w, http.StatusBadRequest, "Idempotency-Key is invalid", err.Error(), 0)
	case res.Status != 0:
		// next answered, but its result could not be stored: sent all the same.
		h.o.OnError(r, err)
		writeResult(w, res, false)
	default:
		h.o.OnError(r, err)
		h.problem(w, http.StatusServiceUnavailable, "The idempotency key store is unavailable", "Nothing was done. Retry with the same Idempotency-Key.", 1)
	}
}

// problem answers with problem details (RFC 9457) and, when retryAfter is
// not zero, a Retry-After of that many seconds.
func (h *handler) problem(w http.ResponseWriter, status int, title, detail string, retryAfter int64) {
	body, _ := json.Marshal(struct { //nolint:errchkjson // strings and an int: cannot fail
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
	}{h.o.ProblemType, title, status, detail})
	w.Header().Set("Content-Type", "application/problem+json")
	if retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(retryAfter, 10))
	}
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeResult sends a result: its header fields, Idempotent-Replayed if it
// is a replay, its status and body.
func writeResult(w http.ResponseWriter, res Result, replayed bool) {
	maps.Copy(w.Header(), res.Header)
	if replayed {
		w.Header().Set(HeaderReplayed, "true")
	}
	w.WriteHeader(cmp.Or(res.Status, http.StatusOK))
	_, _ = w.Write(res.Body)
}

// unstored are the header fields a recorded response leaves out.
var unstored = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Transfer-Encoding", "Upgrade", "Trailer", "Date"}

// recorder is the ResponseWriter next writes to; 1xx go straight out.
type recorder struct {
	w       http.ResponseWriter
	header  http.Header
	sent    http.Header // header at WriteHeader
	status  int
	body    bytes.Buffer
	written bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if status < 100 || status > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", status)) // as net/http's own ResponseWriter does
	}
	if r.written {
		return
	}
	if status < 200 && status != http.StatusSwitchingProtocols {
		maps.Copy(r.w.Header(), r.header)
		r.w.WriteHeader(status)
		return
	}
	r.written, r.status, r.sent = true, status, r.header.Clone()
}

func (r *recorder) Write(p []byte) (int, error) {
	if !r.written {
		if r.header.Get("Content-Type") == "" && len(p) > 0 {
			r.header.Set("Content-Type", http.DetectContentType(p))
		}
		r.WriteHeader(http.StatusOK)
	}
	return r.body.Write(p)
}

// result is what next answered: 200 with no body if it wrote nothing.
func (r *recorder) result() Result {
	if !r.written {
		r.WriteHeader(http.StatusOK)
	}
	h := r.sent
	for name := range h {
		if slices.Contains(unstored, name) || strings.HasPrefix(name, http.TrailerPrefix) {
			delete(h, name)
		}
	}
	return Result{Status: r.status, Header: h, Body: r.body.Bytes()}
}
