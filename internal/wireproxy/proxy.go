// Package wireproxy is a TCP proxy for the MongoDB wire protocol that can
// serialize request/reply exchanges and inject faults.
//
// Serialization: when Config.Serializer is set, the proxy holds that mutex
// from writing a request to the server until it has read the server's reply,
// so at most one exchange is in flight at the server across every connection
// of every proxy that shares the mutex. A request with the moreToCome flag
// gets no reply and releases the mutex as soon as it is written.
//
// Faults: a reply the server sent can be dropped (the connection is closed
// instead, so the client sees a network error for a write that was applied);
// replies can be delayed; all traffic can be paused for a while; every
// connection can be reset.
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
	opMsg = 2013
)

// OP_MSG flag bits.
const (
	flagChecksumPresent = 1 << 0
	flagMoreToCome      = 1 << 1
)

// maxMessageSize bounds what the proxy will read as one message (the
// server's own limit is 48 MB).
const maxMessageSize = 64 << 20

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
	drops   []*Trigger
	delays  []*delayRule
	pausedU time.Time
	closed  bool

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
	d     time.Duration
	match func(*Command) bool
}

// Trigger is an armed one-shot (or n-shot) fault. Fired is closed when the
// fault has acted as many times as it was armed for.
type Trigger struct {
	match     func(*Command) bool
	remaining int
	fired     chan struct{}
	cmds      []*Command
}

// Fired is closed once the fault has acted as often as it was armed for.
func (t *Trigger) Fired() <-chan struct{} { return t.fired }

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
	p := &Proxy{cfg: cfg, ln: ln, conns: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Requests returns how many requests the proxy has forwarded.
func (p *Proxy) Requests() int64 { return p.requests.Load() }

// Close stops listening, closes every connection and waits for the proxy's
// goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.ResetConnections()
	p.wg.Wait()
	return err
}

// DropReplies arms a fault: the next n replies to requests that match are
// read from the server and then discarded, and the client connection is
// closed, so the client sees a network error although the server applied the
// request. A nil match matches every command.
func (p *Proxy) DropReplies(n int, match func(*Command) bool) *Trigger {
	if match == nil {
		match = func(*Command) bool { return true }
	}
	t := &Trigger{match: match, remaining: n, fired: make(chan struct{})}
	if n <= 0 {
		close(t.fired)
		return t
	}
	p.mu.Lock()
	p.drops = append(p.drops, t)
	p.mu.Unlock()
	return t
}

// Dropped returns the commands whose replies t dropped so far.
func (p *Proxy) Dropped(t *Trigger) []*Command {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*Command(nil), t.cmds...)
}

// DelayReplies holds each reply to a matching request for d before passing it
// on, until the returned function is called. A nil match matches every
// command.
func (p *Proxy) DelayReplies(d time.Duration, match func(*Command) bool) (stop func()) {
	if match == nil {
		match = func(*Command) bool { return true }
	}
	r := &delayRule{d: d, match: match}
	p.mu.Lock()
	p.delays = append(p.delays, r)
	p.mu.Unlock()
	return func() {
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
		var cmd *Command
		if p.faultsArmed() {
			cmd = parseCommand(req)
		}
		lock := p.cfg.Serializer
		if lock != nil {
			lock.Lock()
		}
		if _, err := pr.server.Write(req); err != nil {
			if lock != nil {
				lock.Unlock()
			}
			return
		}
		if moreToCome(req) {
			if lock != nil {
				lock.Unlock()
			}
			continue
		}
		reply, err := readMessage(pr.server)
		if lock != nil {
			lock.Unlock()
		}
		if err != nil {
			return
		}
		if cmd != nil {
			if p.takeDrop(cmd) {
				return
			}
			if d := p.delayFor(cmd); d > 0 {
				time.Sleep(d)
			}
		}
		p.waitPause()
		if _, err := pr.client.Write(reply); err != nil {
			return
		}
		// A streaming (exhaust) reply is followed by more replies with no
		// further request.
		for moreToCome(reply) {
			if reply, err = readMessage(pr.server); err != nil {
				return
			}
			if _, err := pr.client.Write(reply); err != nil {
				return
			}
		}
	}
}

func (p *Proxy) faultsArmed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.drops) > 0 || len(p.delays) > 0
}

func (p *Proxy) takeDrop(cmd *Command) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, t := range p.drops {
		if !t.match(cmd) {
			continue
		}
		t.remaining--
		t.cmds = append(t.cmds, cmd)
		if t.remaining <= 0 {
			p.drops = append(p.drops[:i], p.drops[i+1:]...)
			close(t.fired)
		}
		return true
	}
	return false
}

func (p *Proxy) delayFor(cmd *Command) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var d time.Duration
	for _, r := range p.delays {
		if r.match(cmd) && r.d > d {
			d = r.d
		}
	}
	return d
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
