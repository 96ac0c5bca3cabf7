package wireproxy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// fakeServer is a MongoDB-wire server for the proxy's own tests: it reads
// messages one at a time per connection and answers each with what reply
// returns (nil: no answer). It records what it saw, and the order of
// "recv <name>" and "sent <name>" events across connections.
type fakeServer struct {
	ln    net.Listener
	reply func(req []byte) [][]byte

	mu     sync.Mutex
	got    [][]byte
	events []string
	wg     sync.WaitGroup
}

func newFakeServer(t *testing.T, reply func(req []byte) [][]byte) *fakeServer {
	t.Helper()
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	s := &fakeServer{ln: ln, reply: reply}
	s.wg.Go(func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			s.wg.Go(func() { s.serve(c) })
		}
	})
	t.Cleanup(func() { _ = ln.Close(); s.wg.Wait() })
	return s
}

func (s *fakeServer) serve(c net.Conn) {
	defer c.Close()
	for {
		req, err := readMessage(c)
		if err != nil {
			return
		}
		name := parseCommand(req).Name
		s.mu.Lock()
		s.got = append(s.got, req)
		s.events = append(s.events, "recv "+name)
		s.mu.Unlock()
		for _, r := range s.reply(req) {
			s.mu.Lock()
			s.events = append(s.events, "sent "+name)
			s.mu.Unlock()
			if _, err := c.Write(r); err != nil {
				return
			}
		}
	}
}

func (s *fakeServer) seen() ([][]byte, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([][]byte(nil), s.got...), append([]string(nil), s.events...)
}

// okReply answers every message, moreToCome or not, as FerretDB v1 does.
func okReply(req []byte) [][]byte {
	doc, _ := bson.Marshal(bson.D{{Key: "ok", Value: 1.0}, {Key: "cmd", Value: parseCommand(req).Name}})
	return [][]byte{replyMsg(req, doc)}
}

func withID(msg []byte, id uint32) []byte {
	binary.LittleEndian.PutUint32(msg[4:8], id)
	return msg
}

func flagsOf(msg []byte) uint32 { return binary.LittleEndian.Uint32(msg[16:20]) }

func responseTo(msg []byte) uint32 { return binary.LittleEndian.Uint32(msg[8:12]) }

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	var d net.Dialer
	c, err := d.DialContext(context.Background(), "tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	return c
}

func startProxy(t *testing.T, upstream string, lock *sync.Mutex) *Proxy {
	t.Helper()
	p, err := New(Config{Upstream: upstream, Serializer: lock})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func bodyOf(t *testing.T, msg []byte) bson.M {
	t.Helper()
	b, ok := replyBody(msg)
	require.True(t, ok, "not an OP_MSG with a body")
	var m bson.M
	require.NoError(t, bson.Unmarshal(b, &m))
	return m
}

// TestUnacknowledgedIsSerialized: a moreToCome request (a w:0 write) is
// forwarded as an acknowledged one and its reply awaited under the
// serializer, so a request of another connection reaches the server only
// after the server finished the unacknowledged one; the client gets no
// reply for it, and the next reply on its connection is its next request's.
func TestUnacknowledgedIsSerialized(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) }) // never leave the server blocked
	srv := newFakeServer(t, func(req []byte) [][]byte {
		if parseCommand(req).Name == "insert" {
			<-release // the unacknowledged write takes a while at the server
		}
		return okReply(req)
	})
	var lock sync.Mutex
	p1 := startProxy(t, srv.ln.Addr().String(), &lock)
	p2 := startProxy(t, srv.ln.Addr().String(), &lock)
	c1, c2 := dial(t, p1), dial(t, p2)

	w0 := withID(opMsgBytes(t, flagMoreToCome|flagChecksumPresent, bson.D{{Key: "insert", Value: "c"}, {Key: "$db", Value: "x"}}, ""), 7)
	w0 = append(w0, 0, 0, 0, 0)                             // a checksum (not checked by anyone here)
	binary.LittleEndian.PutUint32(w0[0:4], uint32(len(w0))) //nolint:gosec // a test message of a few bytes
	_, err := c1.Write(w0)
	require.NoError(t, err)
	require.Eventually(t, func() bool { _, ev := srv.seen(); return len(ev) == 1 }, 5*time.Second, time.Millisecond)

	find := withID(opMsgBytes(t, 0, bson.D{{Key: "find", Value: "c"}, {Key: "$db", Value: "x"}}, ""), 8)
	errc := make(chan error, 1)
	go func() {
		_, err := c2.Write(find)
		errc <- err
	}()
	require.NoError(t, <-errc)
	time.Sleep(50 * time.Millisecond) // give the find every chance to overtake
	once.Do(func() { close(release) })

	r2, err := readMessage(c2)
	require.NoError(t, err)
	require.Equal(t, uint32(8), responseTo(r2))

	_, err = c1.Write(withID(opMsgBytes(t, 0, bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "x"}}, ""), 9))
	require.NoError(t, err)
	r1, err := readMessage(c1)
	require.NoError(t, err)
	require.Equal(t, uint32(9), responseTo(r1), "the unacknowledged write's reply must not reach the client")
	require.Equal(t, "ping", bodyOf(t, r1)["cmd"])

	got, events := srv.seen()
	require.Equal(t, []string{"recv insert", "sent insert", "recv find", "sent find", "recv ping", "sent ping"}, events,
		"the find reached the server before it had finished the unacknowledged insert")
	require.Zero(t, flagsOf(got[0])&(flagMoreToCome|flagChecksumPresent), "forwarded with moreToCome or a stale checksum")
	require.Equal(t, len(got[0]), int(binary.LittleEndian.Uint32(got[0][0:4])))
	require.Equal(t, "insert", parseCommand(got[0]).Name)
	require.NoError(t, p1.Err())
}

// TestExhaustAllowedIsStripped: the server is never allowed to stream, so
// every exchange stays one request and one reply.
func TestExhaustAllowedIsStripped(t *testing.T) {
	srv := newFakeServer(t, okReply)
	p := startProxy(t, srv.ln.Addr().String(), &sync.Mutex{})
	c := dial(t, p)
	_, err := c.Write(withID(opMsgBytes(t, flagExhaustAllowed, bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}, ""), 3))
	require.NoError(t, err)
	r, err := readMessage(c)
	require.NoError(t, err)
	require.Equal(t, uint32(3), responseTo(r))
	got, _ := srv.seen()
	require.Zero(t, flagsOf(got[0])&flagExhaustAllowed)
	require.NoError(t, p.Err())
}

// requireRefused: the client got the proxy's NotImplemented error reply to
// request id, then its connection closed; Err reports the refusal.
func requireRefused(t *testing.T, p *Proxy, c net.Conn, id uint32, why string) {
	t.Helper()
	r, err := readMessage(c)
	require.NoError(t, err)
	require.Equal(t, id, responseTo(r))
	m := bodyOf(t, r)
	require.InDelta(t, 0.0, m["ok"], 0)
	require.Equal(t, int32(codeNotImplemented), m["code"])
	require.Contains(t, m["errmsg"], "wireproxy: refused: ")
	require.Contains(t, m["errmsg"], why)
	_, err = readMessage(c)
	require.Error(t, err, "the refused connection must be closed")
	require.ErrorIs(t, p.Err(), ErrRefused)
	require.ErrorContains(t, p.Err(), why)
}

// TestStreamedReplyIsRefused: a server that streams although the request
// no longer allows it is refused loudly.
func TestStreamedReplyIsRefused(t *testing.T) {
	srv := newFakeServer(t, func(req []byte) [][]byte {
		r := okReply(req)[0]
		binary.LittleEndian.PutUint32(r[16:20], flagMoreToCome)
		return [][]byte{r, r}
	})
	p := startProxy(t, srv.ln.Addr().String(), &sync.Mutex{})
	c := dial(t, p)
	_, err := c.Write(withID(opMsgBytes(t, flagExhaustAllowed, bson.D{{Key: "hello", Value: 1}, {Key: "$db", Value: "admin"}}, ""), 4))
	require.NoError(t, err)
	requireRefused(t, p, c, 4, "streamed an exhaust reply")
}

// TestUninspectableTrafficIsRefused: compressed messages, legacy op codes
// and exhaust OP_QUERY never reach the server.
func TestUninspectableTrafficIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		op    uint32
		flags uint32
		why   string
	}{
		{"compressed", opCompressed, 0, "compressed messages"},
		{"OP_INSERT", 2002, 0, "op code 2002"},
		{"exhaust OP_QUERY", opQuery, opQueryExhaust, "exhaust OP_QUERY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newFakeServer(t, okReply)
			p := startProxy(t, srv.ln.Addr().String(), &sync.Mutex{})
			c := dial(t, p)
			msg := make([]byte, 32)
			binary.LittleEndian.PutUint32(msg[0:4], 32)
			binary.LittleEndian.PutUint32(msg[4:8], 5)
			binary.LittleEndian.PutUint32(msg[12:16], tc.op)
			binary.LittleEndian.PutUint32(msg[16:20], tc.flags)
			_, err := c.Write(msg)
			require.NoError(t, err)
			if tc.op == opQuery {
				// The refusal of an OP_QUERY is an OP_REPLY.
				r, err := readMessage(c)
				require.NoError(t, err)
				require.Equal(t, uint32(opReply), opCode(r))
				require.Equal(t, uint32(5), responseTo(r))
				var m bson.M
				require.NoError(t, bson.Unmarshal(r[36:], &m))
				require.Contains(t, m["errmsg"], tc.why)
				require.ErrorIs(t, p.Err(), ErrRefused)
			} else {
				requireRefused(t, p, c, 5, tc.why)
			}
			got, _ := srv.seen()
			require.Empty(t, got, "refused traffic reached the server")
		})
	}
}

func TestArmRefusesIncompleteFaults(t *testing.T) {
	srv := newFakeServer(t, okReply)
	p := startProxy(t, srv.ln.Addr().String(), nil)
	for _, f := range []Fault{
		{},
		{Action: Action(99)},
		{Action: RewriteReply},
		{Action: Refuse},
		{Action: Refuse, Reply: bson.Raw{1, 2, 3}},
		{Action: DropReply, Times: -1},
	} {
		tr, err := p.Arm(f)
		require.Error(t, err, "%+v", f)
		require.Nil(t, tr)
	}
	require.False(t, p.faultsArmed())
}

// TestRefuseNeverReachesServer: the client gets the fault's reply; the
// server never sees the request.
func TestRefuseNeverReachesServer(t *testing.T) {
	srv := newFakeServer(t, okReply)
	p := startProxy(t, srv.ln.Addr().String(), nil)
	doc, err := bson.Marshal(bson.D{{Key: "ok", Value: 0.0}, {Key: "code", Value: int32(10107)}})
	require.NoError(t, err)
	tr, err := p.Arm(Fault{Action: Refuse, Reply: doc, Match: func(c *Command) bool { return c.Name == "update" }})
	require.NoError(t, err)
	c := dial(t, p)
	_, err = c.Write(withID(opMsgBytes(t, 0, bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "x"}}, ""), 11))
	require.NoError(t, err)
	r, err := readMessage(c)
	require.NoError(t, err)
	require.Equal(t, uint32(11), responseTo(r))
	require.Equal(t, int32(10107), bodyOf(t, r)["code"])
	<-tr.Fired()
	got, _ := srv.seen()
	require.Empty(t, got)
	require.Len(t, p.Matched(tr), 1)
}

// TestHoldAndDeliver: the held request reaches the server only when
// delivered, on a connection of its own; its reply is returned and kept.
func TestHoldAndDeliver(t *testing.T) {
	srv := newFakeServer(t, okReply)
	p := startProxy(t, srv.ln.Addr().String(), &sync.Mutex{})
	tr, err := p.Arm(Fault{Action: Hold, Match: func(c *Command) bool { return c.Name == "update" }})
	require.NoError(t, err)
	_, err = p.Deliver(context.Background(), tr)
	require.ErrorIs(t, err, ErrNothingHeld)

	c := dial(t, p)
	_, err = c.Write(withID(opMsgBytes(t, 0, bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "x"}}, ""), 12))
	require.NoError(t, err)
	_, err = readMessage(c)
	require.Error(t, err, "the client's connection closes on a hold")
	<-tr.Fired()
	got, _ := srv.seen()
	require.Empty(t, got, "a held request reached the server before Deliver")

	replies, err := p.Deliver(context.Background(), tr)
	require.NoError(t, err)
	require.Len(t, replies, 1)
	var m bson.M
	require.NoError(t, bson.Unmarshal(replies[0], &m))
	require.Equal(t, "update", m["cmd"])
	require.Equal(t, replies, p.Delivered(tr))
	got, _ = srv.seen()
	require.Len(t, got, 1)
	require.Equal(t, "update", parseCommand(got[0]).Name)

	_, err = p.Deliver(context.Background(), tr)
	require.ErrorIs(t, err, ErrNothingHeld, "a held copy is delivered once")
}

// TestDeliverHonoursContext: a server that never answers does not hang
// Deliver past its context; the copy, sent once, is not sent again.
func TestDeliverHonoursContext(t *testing.T) {
	srv := newFakeServer(t, func([]byte) [][]byte { return nil })
	p := startProxy(t, srv.ln.Addr().String(), nil)
	tr, err := p.Arm(Fault{Action: Hold})
	require.NoError(t, err)
	c := dial(t, p)
	_, err = c.Write(withID(opMsgBytes(t, 0, bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "x"}}, ""), 13))
	require.NoError(t, err)
	<-tr.Fired()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err = p.Deliver(ctx, tr)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	got, _ := srv.seen()
	require.Len(t, got, 1, "the copy reached the server")
	_, err = p.Deliver(context.Background(), tr)
	require.ErrorIs(t, err, ErrNothingHeld, "a copy that was sent is not sent again")
}

// TestRewriteReply: the server carries the request out; the client gets
// the rewritten reply; a failing rewrite is a refusal.
func TestRewriteReply(t *testing.T) {
	srv := newFakeServer(t, okReply)
	p := startProxy(t, srv.ln.Addr().String(), nil)
	_, err := p.Arm(Fault{Action: RewriteReply, Times: 2, Rewrite: func(_ *Command, reply bson.Raw) (bson.Raw, error) {
		var d bson.D
		if err := bson.Unmarshal(reply, &d); err != nil {
			return nil, err
		}
		return bson.Marshal(append(d, bson.E{Key: "rewritten", Value: true}))
	}})
	require.NoError(t, err)
	c := dial(t, p)
	_, err = c.Write(withID(opMsgBytes(t, 0, bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "x"}}, ""), 14))
	require.NoError(t, err)
	r, err := readMessage(c)
	require.NoError(t, err)
	require.Equal(t, uint32(14), responseTo(r))
	m := bodyOf(t, r)
	require.Equal(t, true, m["rewritten"])
	require.Equal(t, "update", m["cmd"])

	bad, err := p.Arm(Fault{Action: RewriteReply, Rewrite: func(*Command, bson.Raw) (bson.Raw, error) {
		return nil, errors.New("boom")
	}})
	require.NoError(t, err)
	_ = bad
	// The first armed fault (one action left) acts first.
	_, err = c.Write(withID(opMsgBytes(t, 0, bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "x"}}, ""), 15))
	require.NoError(t, err)
	r, err = readMessage(c)
	require.NoError(t, err)
	require.Equal(t, true, bodyOf(t, r)["rewritten"])
	_, err = c.Write(withID(opMsgBytes(t, 0, bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "x"}}, ""), 16))
	require.NoError(t, err)
	requireRefused(t, p, c, 16, fmt.Sprintf("failed: %v", "boom"))
}

// TestDeliverKeepsUnsentCopy: a copy whose connection could not be made
// stays held for a later Deliver.
func TestDeliverKeepsUnsentCopy(t *testing.T) {
	srv := newFakeServer(t, okReply)
	p := startProxy(t, srv.ln.Addr().String(), nil)
	tr, err := p.Arm(Fault{Action: Hold})
	require.NoError(t, err)
	c := dial(t, p)
	_, err = c.Write(withID(opMsgBytes(t, 0, bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "x"}}, ""), 17))
	require.NoError(t, err)
	<-tr.Fired()
	require.NoError(t, srv.ln.Close())
	_, err = p.Deliver(context.Background(), tr)
	require.ErrorContains(t, err, "dial")
	_, err = p.Deliver(context.Background(), tr)
	require.ErrorContains(t, err, "dial", "the unsent copy is still held")
	require.NotErrorIs(t, err, ErrNothingHeld)
}

// TestFaultsActInArmingOrder: when several faults match, one that acts
// before forwarding acts first (the request never reaches the server, so no
// reply fault can see it); among faults of one phase, the one armed first.
func TestFaultsActInArmingOrder(t *testing.T) {
	srv := newFakeServer(t, okReply)
	p := startProxy(t, srv.ln.Addr().String(), nil)
	doc, err := bson.Marshal(bson.D{{Key: "ok", Value: 0.0}, {Key: "refused", Value: true}})
	require.NoError(t, err)
	rw, err := p.Arm(Fault{Action: RewriteReply, Rewrite: func(*Command, bson.Raw) (bson.Raw, error) {
		return bson.Marshal(bson.D{{Key: "ok", Value: 1.0}, {Key: "rewritten", Value: true}})
	}})
	require.NoError(t, err)
	ref, err := p.Arm(Fault{Action: Refuse, Reply: doc})
	require.NoError(t, err)
	c := dial(t, p)
	for _, step := range []struct {
		id   uint32
		want string
	}{{20, "refused"}, {21, "rewritten"}} {
		i, want := step.id, step.want
		_, err = c.Write(withID(opMsgBytes(t, 0, bson.D{{Key: "update", Value: "c"}, {Key: "$db", Value: "x"}}, ""), i))
		require.NoError(t, err)
		r, err := readMessage(c)
		require.NoError(t, err)
		require.Equal(t, true, bodyOf(t, r)[want], "request %d", i)
	}
	require.Len(t, p.Matched(rw), 1)
	require.Len(t, p.Matched(ref), 1)
	got, _ := srv.seen()
	require.Len(t, got, 1, "only the rewritten request reached the server")
	require.EqualValues(t, 21, binary.LittleEndian.Uint32(got[0][4:8]), "the refused one did not")
}
