package main

import (
	"testing"
)

// The model is held to the versioned package's documented contract, so that
// verify neither fails the library where it is right nor passes a server
// where it is wrong: each bad history below is one the library must never
// produce and the check says broken; its honest twin holds.
func TestModelJudgesHistoriesByTheDocumentedContract(t *testing.T) {
	const k = "d"
	g := func(c int, call, ret int64, n int64) op {
		return op{client: c, call: call, ret: ret, in: vIn{Key: k, Op: 'g'}, out: vOut{Res: resOK, N: n}}
	}
	w := func(c int, o byte, call, ret int64, res byte, n int64) op {
		return op{client: c, call: call, ret: ret, in: vIn{Key: k, Op: o}, out: vOut{Res: res, N: n}}
	}
	// A Guarded settled by a re-read: its write, and the re-read returning n.
	settled := func(c int, id int, call, ret int64, n int64) []op {
		return []op{
			{client: c, call: call, ret: ret, in: vIn{Key: k, Op: 't', Settle: id}, out: vOut{Res: resLanded}},
			{client: c, call: call + 1, ret: ret, in: vIn{Key: k, Op: 'r', Settle: id}, out: vOut{Res: resOK, N: n}},
		}
	}
	cat := func(parts ...[]op) []op {
		var h []op
		for _, p := range parts {
			h = append(h, p...)
		}
		return h
	}
	cases := []struct {
		name        string
		bad, honest []op
	}{{
		// A Guarded whose reply came from the server returns the state its
		// own write made, never a later one.
		name:   "a replied Guarded returns a later state",
		bad:    []op{w(0, 't', 0, 100, resOK, 2), w(1, 'm', 10, 50, resOK, 2)},
		honest: []op{w(0, 't', 0, 100, resOK, 1), w(1, 'm', 10, 50, resOK, 2)},
	}, {
		// Settled by a re-read, it may return a later state (a Modify
		// landed after it, within its call) ...
		name:   "a settled Guarded returns a state that never was",
		bad:    cat(settled(0, 1, 0, 100, 5), []op{w(1, 'm', 10, 50, resOK, 2)}),
		honest: cat(settled(0, 1, 0, 100, 2), []op{w(1, 'm', 10, 50, resOK, 2)}),
	}, {
		// ... but only one seen after its own write: here the state before
		// it, which no read after the write can return.
		name:   "a settled Guarded returns the state before its write",
		bad:    cat(settled(0, 1, 0, 100, 2)),
		honest: cat(settled(0, 1, 0, 100, 1)),
	}, {
		// The write of a settled Guarded applied once: a read after the call
		// must show it.
		name:   "a settled Guarded's write is lost",
		bad:    cat(settled(0, 1, 0, 100, 1), []op{g(1, 200, 210, 2)}),
		honest: cat(settled(0, 1, 0, 100, 1), []op{g(1, 200, 210, 1)}),
	}, {
		// A Modify always returns its own write's state, also after a lost
		// reply: not the later state another write made.
		name:   "a Modify returns a later state",
		bad:    []op{w(0, 'm', 0, 100, resOK, 4), w(1, 'm', 10, 50, resOK, 4)},
		honest: []op{w(0, 'm', 0, 100, resOK, 3), w(1, 'm', 10, 50, resOK, 4)},
	}, {
		// A failed write wrote nothing; one of unknown outcome may have.
		name:   "a failed write applied",
		bad:    []op{w(0, 'm', 0, 10, resFail, 0), g(1, 20, 30, 3)},
		honest: []op{w(0, 'm', 0, never, resUnknown, 0), g(1, 20, 30, 3)},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if r := checkHistory("x", c.bad); r.Result != broken {
				t.Errorf("bad history: %s (%s)", r.Result, r.Detail)
			}
			if r := checkHistory("x", c.honest); r.Result != held {
				t.Errorf("honest history: %s (%s) %v", r.Result, r.Detail, r.History)
			}
		})
	}
}
