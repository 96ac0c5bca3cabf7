package versioned_test

// The model a linearizability check holds the versioned register to, and
// unit tests showing the checker rejects histories that lose or duplicate
// an update (so the concurrent test cannot pass vacuously).

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
)

// regKind is the kind of a register operation.
type regKind int

const (
	regGet     regKind = iota // Get
	regUpdate                 // Update of a document read at version Expect to value Arg
	regModify                 // Modify adding Arg to the value
	regGuarded                // Guarded: if value >= Arg, subtract Arg
	regDelete                 // Delete of a document read at version Expect
	regInsert                 // Insert with value Arg
)

func (k regKind) String() string {
	return [...]string{"get", "update", "modify", "guarded", "delete", "insert"}[k]
}

// regResult is how an operation ended, as the model reads it.
type regResult int

const (
	// resOK: the call succeeded; a write was applied exactly once.
	resOK regResult = iota
	// resRefused: ErrConflict (Update, Delete: the version was not
	// Expect), ErrGuardFailed (Guarded: value < Arg) or ErrDuplicate
	// (Insert: the document exists); nothing was applied.
	resRefused
	// resNotFound: ErrNotFound; there was no document, nothing was applied.
	resNotFound
	// resFailed: any other error; by the package's contract ("reported as
	// applied if and only if it was") nothing was applied.
	resFailed
	// resUnknown: ErrUnknownOutcome; the write may apply, once, at any time
	// from its call on (a late copy may land after the call returned).
	resUnknown
)

func (r regResult) String() string {
	return [...]string{"ok", "refused", "not found", "failed", "unknown"}[r]
}

// regInput is an operation's input: on which document, what kind, and its
// argument.
type regInput struct {
	Key    string
	Kind   regKind
	Expect int64 // regUpdate, regDelete: the version the caller read
	Arg    int64 // regUpdate, regInsert: new value; regModify: delta; regGuarded: amount
}

// regOutput is what the call returned: its result and, on success, the
// document it returned (for Update, the version it set).
type regOutput struct {
	Result  regResult
	Value   int64
	Version int64
}

// regState is one document: whether it exists, its value and version.
// Insert starts each document at a random version, which the model learns
// from the first operation that reports it: until then the version is Free
// (and Version is 0). A free version is one no Update or Delete can have
// read, since a read reports it: so a write that expects a version never
// matches it (versions name their incarnation).
type regState struct {
	Exists  bool
	Value   int64
	Version int64
	Free    bool
}

// regInit is every document's state when the history begins: inserted
// before the history, at a version the first read reports.
var regInit = regState{Exists: true, Value: 100, Free: true}

// regApply returns the state after a write applied to s, and whether the
// write's condition holds in s: the document exists (does not, for Insert)
// and, for Update and Delete, is at version Expect; for Guarded, its value
// is at least Arg.
func regApply(s regState, in regInput) (regState, bool) {
	next := func(v int64) regState {
		if s.Free {
			return regState{Exists: true, Value: v, Free: true}
		}
		return regState{Exists: true, Value: v, Version: s.Version + 1}
	}
	switch in.Kind {
	case regUpdate:
		return regState{Exists: true, Value: in.Arg, Version: in.Expect + 1}, s.Exists && !s.Free && s.Version == in.Expect
	case regModify:
		return next(s.Value + in.Arg), s.Exists
	case regGuarded:
		return next(s.Value - in.Arg), s.Exists && s.Value >= in.Arg
	case regDelete:
		return regState{}, s.Exists && !s.Free && s.Version == in.Expect
	case regInsert:
		return regState{Exists: true, Value: in.Arg, Free: true}, !s.Exists
	case regGet:
	}
	return s, false
}

// regStep lists the states an operation can lead to from s, given what it
// returned; none means the operation cannot be linearized at s.
func regStep(s regState, in regInput, out regOutput) []regState {
	if out.Result == resNotFound {
		if s.Exists {
			return nil
		}
		return []regState{s}
	}
	if in.Kind == regGet {
		switch {
		case out.Result != resOK:
			return []regState{s} // a failed read changes nothing and says nothing
		case s.Exists && out.Value == s.Value && out.Version == s.Version && !s.Free:
			return []regState{s}
		case s.Exists && out.Value == s.Value && s.Free:
			return []regState{{Exists: true, Value: s.Value, Version: out.Version}} // learnt
		}
		return nil
	}
	next, holds := regApply(s, in)
	switch out.Result {
	case resOK:
		if in.Kind == regDelete {
			switch {
			case holds:
				return []regState{next}
			case !s.Exists:
				// Documented: a Delete whose reply was lost and that
				// finds the document gone reports success, although
				// another writer may have removed it.
				return []regState{s}
			}
			return nil
		}
		if !holds {
			return nil
		}
		if next.Free {
			// The document returned is the one this write made (the
			// version is learnt), or a later one (it is not).
			if out.Value == next.Value {
				return []regState{{Exists: true, Value: next.Value, Version: out.Version}, next}
			}
			return []regState{next}
		}
		// The document returned is the one this write made, or (after a
		// lost reply was settled by a re-read) a later one.
		switch {
		case out.Version < next.Version:
			return nil
		case out.Version == next.Version && out.Value != next.Value:
			return nil
		}
		return []regState{next}
	case resRefused:
		if holds {
			return nil
		}
		return []regState{s}
	case resFailed:
		return []regState{s}
	case resNotFound: // decided above
	case resUnknown:
		if holds {
			return []regState{s, next}
		}
		return []regState{s}
	}
	return nil
}

// registerModel is the versioned register as porcupine checks it: one
// partition per document.
var registerModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := asInput(op.Input).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []any { return []any{regInit} },
	Step: func(state, input, output any) []any {
		next := regStep(asState(state), asInput(input), asOutput(output))
		out := make([]any, len(next))
		for i, s := range next {
			out[i] = s
		}
		return out
	},
	Equal: func(a, b any) bool { return asState(a) == asState(b) },
	DescribeOperation: func(input, output any) string {
		in, out := asInput(input), asOutput(output)
		var call string
		switch in.Kind {
		case regGet:
			call = "get()"
		case regUpdate:
			call = fmt.Sprintf("update(v%d → %d)", in.Expect, in.Arg)
		case regModify:
			call = fmt.Sprintf("modify(%+d)", in.Arg)
		case regGuarded:
			call = fmt.Sprintf("guarded(-%d if ≥%d)", in.Arg, in.Arg)
		case regDelete:
			call = fmt.Sprintf("delete(v%d)", in.Expect)
		case regInsert:
			call = fmt.Sprintf("insert(%d)", in.Arg)
		}
		if out.Result == resOK {
			return fmt.Sprintf("%s %s → %d@v%d", in.Key, call, out.Value, out.Version)
		}
		return fmt.Sprintf("%s %s → %s", in.Key, call, out.Result)
	},
	DescribeState: func(state any) string {
		s := asState(state)
		if !s.Exists {
			return "absent"
		}
		if s.Free {
			return fmt.Sprintf("%d@v?", s.Value)
		}
		return fmt.Sprintf("%d@v%d", s.Value, s.Version)
	},
}

// porcupine hands back the values this model gave it; a zero value on a
// mismatch makes the step illegal rather than panic.
func asInput(x any) regInput   { v, _ := x.(regInput); return v }
func asOutput(x any) regOutput { v, _ := x.(regOutput); return v }
func asState(x any) regState   { v, _ := x.(regState); return v }

// never is the return time of an operation whose outcome is unknown: its
// write may land at any time after its call.
const never = math.MaxInt64

// checkLinearizable runs porcupine on the history, bounded by timeout. On
// a violation it writes porcupine's visualization to a file in the system
// temporary directory (kept, for a human) and names it in the failure.
func checkLinearizable(t *testing.T, history []porcupine.Operation, timeout time.Duration) {
	t.Helper()
	model := registerModel.ToModel()
	res, info := porcupine.CheckOperationsVerbose(model, history, timeout)
	switch res {
	case porcupine.Ok:
		return
	case porcupine.Unknown:
		t.Fatalf("the linearizability check did not finish within %v (%d operations): shrink the history", timeout, len(history))
	case porcupine.Illegal:
	}
	// Name the documents whose histories fail, each as a list in call
	// order, for a reader without a browser.
	for _, part := range registerModel.Partition(history) {
		if porcupine.CheckOperationsTimeout(model, part, timeout) != porcupine.Illegal {
			continue
		}
		sorted := slices.Clone(part)
		slices.SortFunc(sorted, func(a, b porcupine.Operation) int { return cmp.Compare(a.Call, b.Call) })
		var b strings.Builder
		for _, o := range sorted {
			ret := "never"
			if o.Return != never {
				ret = fmt.Sprintf("%.1fms", float64(o.Return)/1e6)
			}
			fmt.Fprintf(&b, "\n  client %d [%.1fms, %s] %s", o.ClientId, float64(o.Call)/1e6, ret,
				registerModel.DescribeOperation(o.Input, o.Output))
			if o.Metadata != nil {
				fmt.Fprintf(&b, "  (%v)", o.Metadata)
			}
		}
		t.Logf("not linearizable from %s:%s", registerModel.DescribeState(regInit), b.String())
	}
	where := "(visualization not written)"
	//nolint:usetesting // kept after the test for a human to open; t.TempDir is removed
	if f, err := os.CreateTemp("", "mongocas-linearizability-*.html"); err == nil {
		if err := porcupine.Visualize(model, info, f); err == nil {
			where = f.Name()
		}
		_ = f.Close()
	}
	t.Fatalf("the history of %d operations is not linearizable; porcupine's visualization: %s", len(history), where)
}

// op builds a history entry.
func op(client int, call, ret int64, in regInput, out regOutput) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out}
}

func checkResult(history []porcupine.Operation) porcupine.CheckResult {
	return porcupine.CheckOperationsTimeout(registerModel.ToModel(), history, 10*time.Second)
}

// TestLinearizabilityCheckerRejectsBadHistories shows the checker and the
// model are not vacuous: each doctored history below is one the register
// must never produce, and the checker says Illegal; the honest twin of each
// passes.
func TestLinearizabilityCheckerRejectsBadHistories(t *testing.T) {
	type opIO struct {
		in  regInput
		out regOutput
	}
	get := func(v, ver int64) opIO {
		return opIO{regInput{Key: "a", Kind: regGet}, regOutput{Result: resOK, Value: v, Version: ver}}
	}
	mod := func(d int64, res regResult, v, ver int64) opIO {
		return opIO{regInput{Key: "a", Kind: regModify, Arg: d}, regOutput{Result: res, Value: v, Version: ver}}
	}
	upd := func(expect, val int64, res regResult, ver int64) opIO {
		return opIO{regInput{Key: "a", Kind: regUpdate, Expect: expect, Arg: val}, regOutput{Result: res, Value: val, Version: ver}}
	}
	del := func(expect int64, res regResult) opIO {
		return opIO{regInput{Key: "a", Kind: regDelete, Expect: expect}, regOutput{Result: res}}
	}
	ins := func(val int64, res regResult) opIO {
		return opIO{regInput{Key: "a", Kind: regInsert, Arg: val}, regOutput{Result: res, Value: val, Version: 1}}
	}
	absent := opIO{regInput{Key: "a", Kind: regGet}, regOutput{Result: resNotFound}}
	grd := func(amount int64, res regResult, v, ver int64) opIO {
		return opIO{regInput{Key: "a", Kind: regGuarded, Arg: amount}, regOutput{Result: res, Value: v, Version: ver}}
	}
	type step struct {
		client    int
		call, ret int64
		opIO
	}
	s := func(c int, call, ret int64, x opIO) step { return step{c, call, ret, x} }
	build := func(steps ...step) []porcupine.Operation {
		// Every history opens with a read of the document at version 1
		// (Insert's random start, learnt by the model from this read).
		steps = append([]step{s(9, -20, -10, get(100, 1))}, steps...)
		h := make([]porcupine.Operation, len(steps))
		for i, x := range steps {
			h[i] = op(x.client, x.call, x.ret, x.in, x.out)
		}
		return h
	}
	cases := []struct {
		name   string
		bad    []porcupine.Operation
		honest []porcupine.Operation
	}{{
		// Two concurrent +1s both acknowledged, but the final read shows
		// one: a lost update.
		name: "lost update",
		bad: build(
			s(0, 0, 10, mod(1, resOK, 101, 2)), s(1, 0, 10, mod(1, resOK, 102, 3)),
			s(2, 20, 30, get(101, 2)),
		),
		honest: build(
			s(0, 0, 10, mod(1, resOK, 101, 2)), s(1, 0, 10, mod(1, resOK, 102, 3)),
			s(2, 20, 30, get(102, 3)),
		),
	}, {
		// A +5 reported as a conflict whose effect shows up: applied
		// although it said it was not.
		name: "failed write applied",
		bad: build(
			s(0, 0, 10, mod(5, resRefused, 0, 0)),
			s(1, 20, 30, get(105, 2)),
		),
		honest: build(
			s(0, 0, 10, mod(5, resUnknown, 0, 0)),
			s(1, 20, 30, get(105, 2)),
		),
	}, {
		// An acknowledged +5 applied twice (a late copy landing after the
		// resend).
		name: "applied twice",
		bad: build(
			s(0, 0, 10, mod(5, resOK, 105, 2)),
			s(1, 20, 30, get(110, 3)),
		),
		honest: build(
			s(0, 0, 10, mod(5, resOK, 105, 2)),
			s(1, 20, 30, get(105, 2)),
		),
	}, {
		// Two Updates from the same read version both succeed.
		name: "two CAS winners",
		bad: build(
			s(0, 0, 10, upd(1, 7, resOK, 2)), s(1, 0, 10, upd(1, 8, resOK, 2)),
		),
		honest: build(
			s(0, 0, 10, upd(1, 7, resOK, 2)), s(1, 0, 10, upd(1, 8, resRefused, 0)),
		),
	}, {
		// A guarded withdrawal succeeds below its guard.
		name: "guard ignored",
		bad: build(
			s(0, 0, 10, grd(60, resOK, 40, 2)), s(1, 20, 30, grd(60, resOK, -20, 3)),
		),
		honest: build(
			s(0, 0, 10, grd(60, resOK, 40, 2)), s(1, 20, 30, grd(60, resRefused, 0, 0)),
		),
	}, {
		// A read returns a state that was never written.
		name: "phantom read",
		bad: build(
			s(0, 0, 10, get(100, 1)), s(1, 20, 30, get(99, 1)),
		),
		honest: build(
			s(0, 0, 10, get(100, 1)), s(1, 20, 30, get(100, 1)),
		),
	}, {
		// ABA: an acknowledged Update's late copy lands again in a
		// re-inserted document that reached the version it expected.
		name: "late copy in a new incarnation",
		bad: build(
			s(0, 0, 10, upd(1, 7, resOK, 2)),
			s(1, 20, 30, del(2, resOK)), s(1, 40, 50, ins(50, resOK)),
			s(1, 60, 70, get(7, 2)),
		),
		honest: build(
			s(0, 0, 10, upd(1, 7, resOK, 2)),
			s(1, 20, 30, del(2, resOK)), s(1, 40, 50, ins(50, resOK)),
			s(1, 60, 70, get(50, 1)),
		),
	}, {
		// A deleted document read back, or an Insert that duplicates.
		name: "resurrection",
		bad: build(
			s(0, 0, 10, del(1, resOK)), s(1, 20, 30, get(100, 1)),
		),
		honest: build(
			s(0, 0, 10, del(1, resOK)), s(1, 20, 30, absent),
		),
	}, {
		name: "insert over an existing document",
		bad: build(
			s(0, 0, 10, ins(5, resOK)),
		),
		honest: build(
			s(0, 0, 10, ins(5, resRefused)),
		),
	}, {
		// An unknown outcome may land after later operations (a late copy),
		// but only once.
		name: "unknown outcome applied twice",
		bad: build(
			s(0, 0, never, mod(5, resUnknown, 0, 0)),
			s(1, 20, 30, get(100, 1)), s(1, 40, 50, get(105, 2)), s(1, 60, 70, get(110, 3)),
		),
		honest: build(
			s(0, 0, never, mod(5, resUnknown, 0, 0)),
			s(1, 20, 30, get(100, 1)), s(1, 40, 50, get(105, 2)), s(1, 60, 70, get(105, 2)),
		),
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, porcupine.Illegal, checkResult(tc.bad), "the checker accepted a history the register must never produce")
			require.Equal(t, porcupine.Ok, checkResult(tc.honest), "the checker rejected a legal history")
		})
	}
}

// TestLinearizabilityCheckerBrokenModel: a model that forgets to apply
// Modify accepts nothing a real register produces, so the check depends on
// the model, not only on the history's shape.
func TestLinearizabilityCheckerBrokenModel(t *testing.T) {
	broken := registerModel
	broken.Step = func(state, input, output any) []any {
		s, in, out := asState(state), asInput(input), asOutput(output)
		if in.Kind == regModify && out.Result == resOK {
			return []any{s} // "forgets" the write
		}
		return registerModel.Step(state, input, output)
	}
	h := []porcupine.Operation{
		op(0, 0, 10, regInput{Key: "a", Kind: regModify, Arg: 1}, regOutput{Result: resOK, Value: 101, Version: 2}),
		op(1, 20, 30, regInput{Key: "a", Kind: regGet}, regOutput{Result: resOK, Value: 101, Version: 2}),
	}
	require.Equal(t, porcupine.Ok, checkResult(h))
	require.Equal(t, porcupine.Illegal, porcupine.CheckOperationsTimeout(broken.ToModel(), h, 10*time.Second))
}
