// Package wireproxy is a TCP proxy for the MongoDB wire protocol that can
// serialize request/reply exchanges and inject faults.
//
// Serialization: when Config.Serializer is set, the proxy holds that mutex
// from writing a request to the server until it has read the server's reply,
// so at most one exchange is in flight at the server across every connection
// of every proxy that shares the mutex. Every exchange is a request and one
// reply, so that holds without exception:
//
//   - an unacknowledged request (OP_MSG with the moreToCome flag, as the
//     driver sends a w:0 write) is forwarded without that flag, the proxy
//     waits for the server's reply under the mutex and discards it, so the
//     write has finished at the server before the next exchange starts;
//   - a request that allows an exhaust reply (the exhaustAllowed flag) is
//     forwarded without that flag, so the server answers it once (the driver
//     then polls instead of streaming);
//   - traffic the proxy cannot keep serialized or cannot inspect (a streamed
//     reply, should a server stream unasked; compressed messages; legacy op
//     codes other than OP_QUERY; an exhaust OP_QUERY) is refused loudly: the client gets an error reply
//     (code 238, NotImplemented, whose errmsg starts with "wireproxy:"), the
//     connection is closed, and Err reports it from then on.
//
// Faults (Arm, DropReplies, DelayReplies, Pause, ResetConnections): a reply
// the server sent can be dropped (the connection is closed instead, so the
// client sees a network error for a write that was applied) or rewritten
// (say, to carry a writeConcernError); a request can be answered with an
// error without reaching the server, or held at the proxy and delivered
// later, when the test says so, as a late copy; replies can be delayed; all
// traffic can be paused for a while; every connection can be reset.
package wireproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Wire protocol op codes used here.
const (
	opReply      = 1
	opQuery      = 2004
	opCompressed = 2012
	opMsg        = 2013
)

// OP_MSG flag bits.
const (
	flagChecksumPresent = 1 << 0
	flagMoreToCome      = 1 << 1
	flagExhaustAllowed  = 1 << 16
)

// opQueryExhaust is OP_QUERY's Exhaust flag bit.
const opQueryExhaust = 1 << 6

// maxMessageSize bounds what the proxy will read as one message (the
// server's own limit is 48 MB).
const maxMessageSize = 64 << 20

// codeNotImplemented is the server error code of the proxy's refusals.
const codeNotImplemented = 238

// ErrRefused is matched by the error Err returns: the proxy met traffic it
// cannot keep serialized or cannot inspect, refused it and closed that
// connection.
var ErrRefused = errors.New("wireproxy: refused")

// ErrNothingHeld is returned by Deliver when the trigger holds no request
// that has not been delivered yet.
var ErrNothingHeld = errors.New("wireproxy: no held request to deliver")

// Command describes a client request, parsed from its OP_MSG body, for fault
// predicates.
type Command struct {
	// Name is the command name: the first key of the body ("update", "find",
	// "findAndModify", "hello", ...). Empty for messages other than OP_MSG.
	Name string
	// Collection is the value of the first key when it is a string (the
	// collection the command targets).
	Collection string
	// Database is the value of "$db".
	Database string
	// Body is the command document (section kind 0).
	Body bson.Raw
	// Sequences holds the document sequences (section kind 1) by identifier,
	// such as "updates" or "documents".
	Sequences map[string][]bson.Raw
}

// Config configures a Proxy.
type Config struct {
	// Upstream is the server address, host:port. Required.
	Upstream string
	// Listen is the address to listen on. Default "127.0.0.1:0".
	Listen string
	// Serializer, when not nil, is held for each request/reply exchange.
	// Proxies that share one mutex serialize against each other.
	Serializer *sync.Mutex
	// DialTimeout bounds dialing the upstream. Default 5s.
	DialTimeout time.Duration
}

// Proxy forwards MongoDB wire traffic from its listener to one upstream.
type Proxy struct {
	cfg Config
	ln  net.Listener

	mu      sync.Mutex
	conns   map[*pair]struct{}
	faults  []*Trigger
	delays  []*delayRule
	pausedU time.Time
	closed  bool
	done    chan struct{} // closed by Close: delays end at once
	err     error

	wg       sync.WaitGroup
	requests atomic.Int64
}

type pair struct {
	client, server net.Conn
	once           sync.Once
}

func (p *pair) close() {
	p.once.Do(func() {
		_ = p.client.Close()
		_ = p.server.Close()
	})
}

type delayRule struct {
	d       time.Duration
	match   func(*Command) bool
	stopped chan struct{} // closed by the rule's stop: its delays end at once
	once    sync.Once
}

// Action is what an armed fault does to the exchange of a request it
// matches.
type Action int

// The actions of a Fault.
const (
	// DropReply forwards the request, reads the server's reply, discards it
	// and closes the client's connection: the client sees a network error
	// for a request the server carried out.
	DropReply Action = iota + 1
	// RewriteReply forwards the request and gives the client the server's
	// reply as Fault.Rewrite changed it: the server carried out the request,
	// the client sees what Rewrite made of the reply.
	RewriteReply
	// Refuse does not forward the request: the client gets Fault.Reply as
	// the server's answer, and the server never sees the request.
	Refuse
	// Hold does not forward the request: the proxy keeps it and closes the
	// client's connection, so the client sees a network error for a request
	// the server has not seen yet. Deliver sends the kept copy to the server
	// later, when the caller decides: a late copy.
	Hold
)

// String returns the action's name.
func (a Action) String() string {
	switch a {
	case DropReply:
		return "DropReply"
	case RewriteReply:
		return "RewriteReply"
	case Refuse:
		return "Refuse"
	case Hold:
		return "Hold"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// Fault configures Arm.
type Fault struct {
	// Action is what the fault does. Required.
	Action Action
	// Match selects the requests the fault acts on. Nil matches every
	// request. Faults act only on OP_MSG requests that expect a reply; when
	// several armed faults match a request, the one armed first acts. Match
	// is called only where the fault acts: before forwarding for Hold and
	// Refuse, after the server replied (so after it applied the request) for
	// DropReply and RewriteReply.
	Match func(*Command) bool
	// Times is how many matching requests the fault acts on. Default 1.
	Times int
	// Rewrite, for RewriteReply, returns the reply body the client gets,
	// given the request and the server's reply body. Required for
	// RewriteReply.
	Rewrite func(cmd *Command, reply bson.Raw) (bson.Raw, error)
	// Reply, for Refuse, is the reply body the client gets. Required for
	// Refuse.
	Reply bson.Raw
}

// Trigger is an armed fault. Fired is closed when the fault has acted as
// many times as it was armed for.
type Trigger struct {
	action    Action
	match     func(*Command) bool
	remaining int
	rewrite   func(*Command, bson.Raw) (bson.Raw, error)
	reply     bson.Raw
	fired     chan struct{}

	// Guarded by the proxy's mu.
	cmds      []*Command
	held      [][]byte
	delivered []bson.Raw
}

// Fired is closed once the fault has acted as often as it was armed for.
func (t *Trigger) Fired() <-chan struct{} { return t.fired }

// Action returns what the fault does.
func (t *Trigger) Action() Action { return t.action }

// New starts a proxy. Close it when done.
func New(cfg Config) (*Proxy, error) {
	if cfg.Upstream == "" {
		return nil, errors.New("wireproxy: Config.Upstream is empty")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("wireproxy: listen on %s: %w", cfg.Listen, err)
	}
	p := &Proxy{cfg: cfg, ln: ln, conns: map[*pair]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Requests returns how many requests the proxy has forwarded.
func (p *Proxy) Requests() int64 { return p.requests.Load() }

// Err returns the first refusal (see the package documentation), matching
// ErrRefused, or nil if the proxy has refused nothing.
func (p *Proxy) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Close stops listening, closes every connection and waits for the proxy's
// goroutines to end. Requests still held are discarded.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	err := p.ln.Close()
	p.ResetConnections()
	p.wg.Wait()
	return err
}

// Arm arms a fault. It returns an error, and arms nothing, when f is
// incomplete: an unknown Action, a negative Times, RewriteReply without
// Rewrite, Refuse without a valid Reply document.
func (p *Proxy) Arm(f Fault) (*Trigger, error) {
	switch f.Action {
	case DropReply, Hold:
	case RewriteReply:
		if f.Rewrite == nil {
			return nil, errors.New("wireproxy: RewriteReply fault without Rewrite")
		}
	case Refuse:
		if err := f.Reply.Validate(); err != nil || len(f.Reply) == 0 {
			return nil, fmt.Errorf("wireproxy: Refuse fault without a valid Reply document: %w", err)
		}
	default:
		return nil, fmt.Errorf("wireproxy: unknown fault action %v", f.Action)
	}
	if f.Times < 0 {
		return nil, fmt.Errorf("wireproxy: fault Times %d is negative", f.Times)
	}
	if f.Times == 0 {
		f.Times = 1
	}
	if f.Match == nil {
		f.Match = func(*Command) bool { return true }
	}
	t := &Trigger{
		action: f.Action, match: f.Match, remaining: f.Times,
		rewrite: f.Rewrite, reply: f.Reply, fired: make(chan struct{}),
	}
	p.mu.Lock()
	p.faults = append(p.faults, t)
	p.mu.Unlock()
	return t, nil
}

// DropReplies arms a fault: the next n replies to requests that match are
// read from the server and then discarded, and the client connection is
// closed, so the client sees a network error although the server applied the
// request. A nil match matches every command. n <= 0 arms nothing and
// returns a trigger that has already fired.
func (p *Proxy) DropReplies(n int, match func(*Command) bool) *Trigger {
	if n <= 0 {
		t := &Trigger{action: DropReply, fired: make(chan struct{})}
		close(t.fired)
		return t
	}
	t, err := p.Arm(Fault{Action: DropReply, Match: match, Times: n})
	if err != nil {
		panic(err) // unreachable: the fault is complete
	}
	return t
}

// Dropped returns the commands t acted on so far (for DropReplies, those
// whose replies it dropped). It is Matched, under the name it had first.
func (p *Proxy) Dropped(t *Trigger) []*Command { return p.Matched(t) }

// Matched returns the commands t acted on so far, in order.
func (p *Proxy) Matched(t *Trigger) []*Command {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Command(nil), t.cmds...)
}

// Delivered returns the server's reply bodies to the requests Deliver sent
// for t so far, in order.
func (p *Proxy) Delivered(t *Trigger) []bson.Raw {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]bson.Raw(nil), t.delivered...)
}

// Deliver sends the requests a Hold trigger kept, and has not delivered yet,
// to the server, each on a connection of its own and under the Serializer,
// and returns the server's reply bodies in order. It returns ErrNothingHeld
// when there is nothing to deliver (the fault has not fired yet, or its
// copies were delivered already). Each copy is sent at most once: one whose
// exchange fails after it was written is not kept (the server may have
// carried it out), one whose connection could not be made is kept for a
// later Deliver. It works after Close too. ctx bounds each dial and
// exchange.
func (p *Proxy) Deliver(ctx context.Context, t *Trigger) ([]bson.Raw, error) {
	p.mu.Lock()
	held := t.held
	t.held = nil
	p.mu.Unlock()
	if len(held) == 0 {
		return nil, ErrNothingHeld
	}
	var replies []bson.Raw
	for i, req := range held {
		body, sent, err := p.deliverOne(ctx, req)
		if err != nil {
			if !sent {
				i-- // keep this copy too
			}
			p.mu.Lock()
			t.held = append(held[i+1:len(held):len(held)], t.held...)
			p.mu.Unlock()
			return replies, err
		}
		p.mu.Lock()
		t.delivered = append(t.delivered, body)
		p.mu.Unlock()
		replies = append(replies, body)
	}
	return replies, nil
}

// deliverOne sends req on a fresh connection and reads the reply; sent says
// whether req may have reached the server.
func (p *Proxy) deliverOne(ctx context.Context, req []byte) (_ bson.Raw, sent bool, _ error) {
	d := net.Dialer{Timeout: p.cfg.DialTimeout}
	c, err := d.DialContext(ctx, "tcp", p.cfg.Upstream)
	if err != nil {
		return nil, false, fmt.Errorf("wireproxy: deliver: dial %s: %w", p.cfg.Upstream, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	reply, err := p.exchange(c, req)
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, true, fmt.Errorf("wireproxy: deliver: %w", err)
	}
	body, ok := replyBody(reply)
	if !ok {
		return nil, true, errors.New("wireproxy: deliver: the server's reply is not an OP_MSG with a body")
	}
	return body, true, nil
}

// DelayReplies holds each reply to a matching request for d before passing it
// on, until the returned function is called: stop (or Close) also ends at
// once the delays of replies being held, which then go on. A nil match
// matches every command.
func (p *Proxy) DelayReplies(d time.Duration, match func(*Command) bool) (stop func()) {
	if match == nil {
		match = func(*Command) bool { return true }
	}
	r := &delayRule{d: d, match: match, stopped: make(chan struct{})}
	p.mu.Lock()
	p.delays = append(p.delays, r)
	p.mu.Unlock()
	return func() {
		r.once.Do(func() { close(r.stopped) })
		p.mu.Lock()
		defer p.mu.Unlock()
		for i, x := range p.delays {
			if x == r {
				p.delays = append(p.delays[:i], p.delays[i+1:]...)
				return
			}
		}
	}
}

// Pause holds all traffic, requests and replies, for d from now. It returns at
// once.
func (p *Proxy) Pause(d time.Duration) {
	p.mu.Lock()
	if until := time.Now().Add(d); until.After(p.pausedU) {
		p.pausedU = until
	}
	p.mu.Unlock()
}

// ResetConnections closes every open connection, client and server side, and
// returns how many it closed.
func (p *Proxy) ResetConnections() int {
	p.mu.Lock()
	ps := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		ps = append(ps, c)
	}
	p.mu.Unlock()
	for _, c := range ps {
		c.close()
	}
	return len(ps)
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		d := net.Dialer{Timeout: p.cfg.DialTimeout}
		s, err := d.DialContext(context.Background(), "tcp", p.cfg.Upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		pr := &pair{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pr.close()
			return
		}
		p.conns[pr] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go p.serve(pr)
	}
}

// phase says when a fault acts: before the request is forwarded (Refuse,
// Hold) or after the server's reply is read (DropReply, RewriteReply).
type phase bool

const (
	beforeForward phase = false
	afterReply    phase = true
)

func (a Action) phase() phase {
	if a == Refuse || a == Hold {
		return beforeForward
	}
	return afterReply
}

func (p *Proxy) serve(pr *pair) {
	defer p.wg.Done()
	defer func() {
		pr.close()
		p.mu.Lock()
		delete(p.conns, pr)
		p.mu.Unlock()
	}()
	for {
		req, err := readMessage(pr.client)
		if err != nil {
			return
		}
		p.waitPause()
		p.requests.Add(1)
		if why := unsupported(req); why != "" {
			p.refuse(pr, req, why)
			return
		}
		acked := !moreToCome(req)
		fwd := forwardable(req)
		var cmd *Command
		if acked && opCode(req) == opMsg && p.faultsArmed() {
			cmd = parseCommand(req)
		}
		if cmd != nil {
			if t := p.take(cmd, beforeForward, fwd); t != nil {
				if t.action == Hold {
					return // the client sees its connection close
				}
				if _, err := pr.client.Write(replyMsg(req, t.reply)); err != nil {
					return
				}
				continue
			}
		}
		reply, err := p.exchange(pr.server, fwd)
		if err != nil {
			return
		}
		if !acked {
			continue // the client expects no reply
		}
		if moreToCome(reply) {
			p.refuse(pr, req, "the server streamed an exhaust reply, which the proxy cannot serialize")
			return
		}
		if cmd != nil {
			if t := p.take(cmd, afterReply, nil); t != nil {
				switch t.action {
				case DropReply:
					return
				case RewriteReply:
					if reply, err = rewrite(t, cmd, req, reply); err != nil {
						p.refuse(pr, req, err.Error())
						return
					}
				case Refuse, Hold: // before forwarding, not here
				}
			}
			p.delay(cmd)
		}
		p.waitPause()
		if _, err := pr.client.Write(reply); err != nil {
			return
		}
	}
}

// exchange writes req to server and reads its reply, holding the Serializer
// for the whole exchange.
func (p *Proxy) exchange(server net.Conn, req []byte) ([]byte, error) {
	if lock := p.cfg.Serializer; lock != nil {
		lock.Lock()
		defer lock.Unlock()
	}
	if _, err := server.Write(req); err != nil {
		return nil, err
	}
	return readMessage(server)
}

// refuse reports traffic the proxy cannot keep serialized or inspect: the
// client gets an error reply (when its request expects one) and Err returns
// the refusal from now on. The caller closes the connection.
func (p *Proxy) refuse(pr *pair, req []byte, why string) {
	err := fmt.Errorf("%w: %s", ErrRefused, why)
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
	if moreToCome(req) {
		return
	}
	doc, _ := bson.Marshal(bson.D{
		{Key: "ok", Value: 0.0},
		{Key: "errmsg", Value: err.Error()},
		{Key: "code", Value: int32(codeNotImplemented)},
		{Key: "codeName", Value: "NotImplemented"},
	})
	_, _ = pr.client.Write(replyMsg(req, doc))
}

func rewrite(t *Trigger, cmd *Command, req, reply []byte) ([]byte, error) {
	body, ok := replyBody(reply)
	if !ok {
		return nil, errors.New("a RewriteReply fault met a reply that is not an OP_MSG with a body")
	}
	nb, err := t.rewrite(cmd, body)
	if err != nil {
		return nil, fmt.Errorf("a RewriteReply fault failed: %w", err)
	}
	if err := nb.Validate(); err != nil {
		return nil, fmt.Errorf("a RewriteReply fault returned an invalid document: %w", err)
	}
	return replyMsg(req, nb), nil
}

// unsupported says why the proxy cannot forward msg, or "" when it can.
func unsupported(msg []byte) string {
	switch op := opCode(msg); op {
	case opMsg:
		return ""
	case opQuery:
		if len(msg) >= 20 && binary.LittleEndian.Uint32(msg[16:20])&opQueryExhaust != 0 {
			return "an exhaust OP_QUERY cannot be serialized"
		}
		return ""
	case opCompressed:
		return "compressed messages cannot be inspected; turn compression off"
	default:
		return fmt.Sprintf("op code %d is not OP_MSG or OP_QUERY", op)
	}
}

// forwardable returns msg as the proxy forwards it: an OP_MSG loses the
// moreToCome and exhaustAllowed flags (and its checksum, which covers the
// flags), so that the server answers it exactly once.
func forwardable(msg []byte) []byte {
	if opCode(msg) != opMsg || len(msg) < 20 {
		return msg
	}
	flags := binary.LittleEndian.Uint32(msg[16:20])
	if flags&(flagMoreToCome|flagExhaustAllowed) == 0 {
		return msg
	}
	out := append([]byte(nil), msg...)
	if flags&flagChecksumPresent != 0 && len(out) >= 24 {
		out = out[:len(out)-4]
		binary.LittleEndian.PutUint32(out[0:4], uint32(len(out))) //nolint:gosec // bounded by maxMessageSize
	}
	flags &^= flagMoreToCome | flagExhaustAllowed | flagChecksumPresent
	binary.LittleEndian.PutUint32(out[16:20], flags)
	return out
}

// replyBody returns the body section of an OP_MSG reply.
func replyBody(msg []byte) (bson.Raw, bool) {
	if opCode(msg) != opMsg {
		return nil, false
	}
	cmd := parseCommand(msg)
	return cmd.Body, cmd.Body != nil
}

// replyMsg builds a reply to req carrying body: an OP_MSG, or an OP_REPLY
// when req is an OP_QUERY.
func replyMsg(req []byte, body bson.Raw) []byte {
	reqID := binary.LittleEndian.Uint32(req[4:8])
	var out []byte
	if opCode(req) == opQuery {
		out = make([]byte, 36, 36+len(body))
		binary.LittleEndian.PutUint32(out[12:16], opReply)
		binary.LittleEndian.PutUint32(out[32:36], 1) // numberReturned
	} else {
		out = make([]byte, 21, 21+len(body))
		binary.LittleEndian.PutUint32(out[12:16], opMsg)
	}
	out = append(out, body...)
	binary.LittleEndian.PutUint32(out[0:4], uint32(len(out))) //nolint:gosec // bounded by maxMessageSize
	binary.LittleEndian.PutUint32(out[4:8], reqID^0x40000000)
	binary.LittleEndian.PutUint32(out[8:12], reqID)
	return out
}

func (p *Proxy) faultsArmed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.faults) > 0 || len(p.delays) > 0
}

// take finds the first armed fault that acts in phase ph and matches cmd, in
// the order they were armed, and counts one action of it. A fault's Match is
// called only in the phase it acts in. A Hold keeps req.
func (p *Proxy) take(cmd *Command, ph phase, req []byte) *Trigger {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, t := range p.faults {
		// Match only in the phase the fault acts in: a Match of a fault that
		// acts on the reply runs after the server applied the request, so
		// tests may use it as a hook that runs "meanwhile", between the write
		// landing and its writer hearing of it.
		if t.action.phase() != ph || !t.match(cmd) {
			continue
		}
		t.remaining--
		t.cmds = append(t.cmds, cmd)
		if t.action == Hold {
			t.held = append(t.held, req)
		}
		if t.remaining <= 0 {
			p.faults = append(p.faults[:i], p.faults[i+1:]...)
			close(t.fired)
		}
		return t
	}
	return nil
}

// delay holds the reply to cmd for the longest delay of the rules it
// matches: each rule holds it for its d from now, or until it is stopped,
// or until the proxy is closed.
func (p *Proxy) delay(cmd *Command) {
	p.mu.Lock()
	var rules []*delayRule
	for _, r := range p.delays {
		if r.d > 0 && r.match(cmd) {
			rules = append(rules, r)
		}
	}
	p.mu.Unlock()
	start := time.Now()
	for _, r := range rules {
		wait := r.d - time.Since(start)
		if wait <= 0 {
			continue
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-r.stopped:
		case <-p.done:
		}
		t.Stop()
	}
}

func (p *Proxy) waitPause() {
	for {
		p.mu.Lock()
		until, closed := p.pausedU, p.closed
		p.mu.Unlock()
		wait := time.Until(until)
		if closed || wait <= 0 {
			return
		}
		time.Sleep(min(wait, 50*time.Millisecond))
	}
}

// readMessage reads one whole wire message, header included.
func readMessage(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if n < 16 || n > maxMessageSize {
		return nil, fmt.Errorf("wireproxy: bad message length %d", n)
	}
	msg := make([]byte, n)
	copy(msg, hdr[:])
	if _, err := io.ReadFull(r, msg[4:]); err != nil {
		return nil, err
	}
	return msg, nil
}

func opCode(msg []byte) uint32 { return binary.LittleEndian.Uint32(msg[12:16]) }

func moreToCome(msg []byte) bool {
	if opCode(msg) != opMsg || len(msg) < 20 {
		return false
	}
	return binary.LittleEndian.Uint32(msg[16:20])&flagMoreToCome != 0
}

// parseCommand extracts the command from an OP_MSG. It never fails: what it
// cannot parse is left empty.
func parseCommand(msg []byte) *Command {
	cmd := &Command{}
	if opCode(msg) != opMsg || len(msg) < 21 {
		return cmd
	}
	flags := binary.LittleEndian.Uint32(msg[16:20])
	body := msg[20:]
	if flags&flagChecksumPresent != 0 && len(body) >= 4 {
		body = body[:len(body)-4]
	}
	for len(body) > 0 {
		kind := body[0]
		body = body[1:]
		switch kind {
		case 0:
			doc, rest, ok := bsoncoreDoc(body)
			if !ok {
				return cmd
			}
			cmd.Body = doc
			body = rest
		case 1:
			if len(body) < 4 {
				return cmd
			}
			size := int(binary.LittleEndian.Uint32(body))
			if size < 4 || size > len(body) {
				return cmd
			}
			sec := body[4:size]
			body = body[size:]
			i := 0
			for i < len(sec) && sec[i] != 0 {
				i++
			}
			if i >= len(sec) {
				return cmd
			}
			id := string(sec[:i])
			sec = sec[i+1:]
			if cmd.Sequences == nil {
				cmd.Sequences = map[string][]bson.Raw{}
			}
			for len(sec) > 0 {
				doc, rest, ok := bsoncoreDoc(sec)
				if !ok {
					break
				}
				cmd.Sequences[id] = append(cmd.Sequences[id], doc)
				sec = rest
			}
		default:
			return cmd
		}
	}
	if cmd.Body != nil {
		if elems, err := cmd.Body.Elements(); err == nil && len(elems) > 0 {
			cmd.Name = elems[0].Key()
			if s, ok := elems[0].Value().StringValueOK(); ok {
				cmd.Collection = s
			}
		}
		if v, err := cmd.Body.LookupErr("$db"); err == nil {
			cmd.Database, _ = v.StringValueOK()
		}
	}
	return cmd
}

func bsoncoreDoc(b []byte) (bson.Raw, []byte, bool) {
	if len(b) < 5 {
		return nil, nil, false
	}
	n := int(binary.LittleEndian.Uint32(b))
	if n < 5 || n > len(b) {
		return nil, nil, false
	}
	return bson.Raw(b[:n]), b[n:], true
}
