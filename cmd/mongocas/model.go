package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Outcomes of a call, as the history records them.
const (
	resOK      byte = 'o' // applied (or read), with the document's n right after it
	resFail    byte = 'f' // a definite failure: nothing was written
	resGuard   byte = 'g' // Guarded's condition did not hold: nothing was written
	resUnknown byte = 'u' // it may or may not have applied, at any time after its call
	// resLanded: a Guarded whose reply was lost and whose re-read found it
	// landed. It applied once, within its call; the document it returned is
	// the one re-read, which may include later writes: that read is a
	// separate entry of the history (Op 'r', same Settle), which the model
	// places after the write and within the same call.
	resLanded byte = 'l'
)

// never is the return time of a call whose outcome is unknown.
const never = math.MaxInt64

// vIn is a call on one document: 'm' Modify +1, 't' Guarded -1 if n ≥ 1,
// 'g' Get, 'r' the re-read that settled a lost Guarded reply. Settle links a
// resLanded Guarded to its re-read ('r'); 0 for every other call.
type vIn struct {
	Key    string
	Op     byte
	Settle int
}

// vOut is a call's outcome and, when it succeeded, the document's n as the
// call returned it.
type vOut struct {
	Res byte
	N   int64
}

// op is a history entry.
type op struct {
	client    int
	call, ret int64
	in        vIn
	out       vOut
	err       string
}

// vState is one document in the model: its n, and the settled Guarded calls
// whose write is placed but whose re-read is not yet (Settle ids, sorted).
type vState struct {
	N    int64
	Open string
}

func (s vState) opened(id int) vState {
	ids := append(s.ids(), id)
	slices.Sort(ids)
	return vState{N: s.N, Open: joinIDs(ids)}
}

// closed returns s without id, and whether id was open.
func (s vState) closed(id int) (vState, bool) {
	ids := s.ids()
	i := slices.Index(ids, id)
	if i < 0 {
		return s, false
	}
	return vState{N: s.N, Open: joinIDs(slices.Delete(ids, i, i+1))}, true
}

func (s vState) ids() []int {
	var ids []int
	for f := range strings.FieldsSeq(s.Open) {
		n, _ := strconv.Atoi(f)
		ids = append(ids, n)
	}
	return ids
}

func joinIDs(ids []int) string {
	f := make([]string, len(ids))
	for i, n := range ids {
		f[i] = strconv.Itoa(n)
	}
	return strings.Join(f, " ")
}

// vStep is the versioned package's documented contract for the calls
// verify makes, on one document in state s: the states the call can lead
// to, given what it returned; none means it cannot be placed at s.
//
//   - Modify returns the document as its own write left it, also after a
//     lost reply it settled (it knows what it wrote).
//   - Guarded returns the document as its write left it; after a lost reply
//     that a re-read found landed, the document re-read, which may include
//     later writes (resLanded and its 'r').
//   - A call that failed, or whose condition did not hold, wrote nothing;
//     one of unknown outcome applied at most once, at any time after its
//     call.
func vStep(s vState, in vIn, out vOut) []vState {
	switch in.Op {
	case 'g':
		if out.N == s.N {
			return []vState{s}
		}
	case 'r':
		if c, ok := s.closed(in.Settle); ok && out.N == s.N {
			return []vState{c}
		}
	case 'm':
		up := vState{N: s.N + 1, Open: s.Open}
		switch out.Res {
		case resOK:
			if out.N == s.N+1 {
				return []vState{up}
			}
		case resFail, resGuard:
			return []vState{s}
		case resUnknown:
			return []vState{s, up}
		}
	case 't':
		down := vState{N: s.N - 1, Open: s.Open}
		switch out.Res {
		case resOK:
			if s.N >= 1 && out.N == s.N-1 {
				return []vState{down}
			}
		case resLanded:
			if s.N >= 1 {
				return []vState{down.opened(in.Settle)}
			}
		case resGuard:
			if s.N < 1 {
				return []vState{s}
			}
		case resFail:
			return []vState{s}
		case resUnknown:
			if s.N >= 1 {
				return []vState{s, down}
			}
			return []vState{s}
		}
	}
	return nil
}

// counterModel is the versioned counter as porcupine checks it: one
// partition per document, each starting at initN.
var counterModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, o := range h {
			k := as[vIn](o.Input).Key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], o)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() []any { return []any{vState{N: initN}} },
	Step: func(state, input, output any) []any {
		next := vStep(as[vState](state), as[vIn](input), as[vOut](output))
		out := make([]any, len(next))
		for i, s := range next {
			out[i] = s
		}
		return out
	},
	Equal: func(a, b any) bool { return as[vState](a) == as[vState](b) },
	DescribeOperation: func(input, output any) string {
		in, out := as[vIn](input), as[vOut](output)
		call := map[byte]string{'g': "get()", 'm': "modify(+1)", 't': "guarded(-1 if n ≥ 1)",
			'r': fmt.Sprintf("re-read of settled guarded #%d", in.Settle)}[in.Op]
		switch out.Res {
		case resOK:
			return fmt.Sprintf("%s %s → n=%d", in.Key, call, out.N)
		case resLanded:
			return fmt.Sprintf("%s %s #%d → reply lost, landed (settled by a re-read)", in.Key, call, in.Settle)
		case resGuard:
			return fmt.Sprintf("%s %s → guard failed", in.Key, call)
		case resFail:
			return fmt.Sprintf("%s %s → failed, nothing written", in.Key, call)
		}
		return fmt.Sprintf("%s %s → outcome unknown", in.Key, call)
	},
	DescribeState: func(state any) string {
		s := as[vState](state)
		if s.Open == "" {
			return fmt.Sprintf("n=%d", s.N)
		}
		return fmt.Sprintf("n=%d (re-reads pending: %s)", s.N, s.Open)
	},
}

// as unwraps a value porcupine hands back to the model: only the states,
// inputs and outputs this file gives it, so another type is a bug here.
func as[T any](v any) T {
	t, ok := v.(T)
	if !ok {
		panic(fmt.Sprintf("porcupine model: got %T, want %T", v, t))
	}
	return t
}

func toPorcupine(h []op) []porcupine.Operation {
	out := make([]porcupine.Operation, len(h))
	for i, o := range h {
		out[i] = porcupine.Operation{ClientId: o.client, Input: o.in, Output: o.out, Call: o.call, Return: o.ret, Metadata: o.err}
	}
	return out
}

// checkHistory checks the history with porcupine and, when it is not
// linearizable, finds the shortest prefix (in call order) of the first
// failing document's history that is not, and shows it.
func checkHistory(name string, h []op) checkResult {
	res := checkResult{Name: name, Kind: "guarantee"}
	if len(h) == 0 {
		res.Result, res.Detail = notTestable, "no operation completed in the time given: raise --duration"
		return res
	}
	model := counterModel.ToModel()
	const limit = 20 * time.Second
	unknown, landed := 0, 0
	docs := map[string]bool{}
	for _, o := range h {
		docs[o.in.Key] = true
		switch o.out.Res {
		case resUnknown:
			unknown++
		case resLanded:
			landed++
		}
	}
	switch porcupine.CheckOperationsTimeout(model, toPorcupine(h), limit) {
	case porcupine.Ok:
		res.Result = held
		res.Detail = fmt.Sprintf("%d operations on %d documents linearizable (porcupine); %d Guarded settled by a re-read, %d of unknown outcome",
			len(h), len(docs), landed, unknown)
		return res
	case porcupine.Unknown:
		res.Result = notTestable
		res.Detail = fmt.Sprintf("porcupine did not decide %d operations within %v", len(h), limit)
		return res
	case porcupine.Illegal:
		// Shown below: the shortest failing prefix of each broken document.
	}
	res.Result = broken
	res.Detail = fmt.Sprintf("%d operations on %d documents are not linearizable (porcupine): a write was lost, doubled, or reported wrongly", len(h), len(docs))
	by := map[string][]op{}
	for _, o := range h {
		by[o.in.Key] = append(by[o.in.Key], o)
	}
	for _, part := range by {
		if porcupine.CheckOperationsTimeout(model, toPorcupine(part), limit) != porcupine.Illegal {
			continue
		}
		slices.SortFunc(part, func(a, b op) int { return cmp.Compare(a.call, b.call) })
		// The shortest illegal closed prefix: the first k calls and every call
		// made before one of them returned. A linearizable history has only
		// linearizable closed prefixes, so the search is sound.
		closed := func(k int) []op {
			var maxRet int64
			j := 0
			for ; j < len(part) && (j < k || part[j].call < maxRet); j++ {
				if part[j].ret != never {
					maxRet = max(maxRet, part[j].ret)
				}
			}
			return part[:j]
		}
		lo, hi := 1, len(part)
		for lo < hi {
			mid := (lo + hi) / 2
			if porcupine.CheckOperationsTimeout(model, toPorcupine(closed(mid)), limit) == porcupine.Illegal {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		shown := closed(hi)
		res.History = append(res.History, fmt.Sprintf("%s starts at n=%d", part[0].in.Key, initN))
		for _, o := range shown {
			ret := "never"
			if o.ret != never {
				ret = fmt.Sprintf("%.1fms", float64(o.ret)/1e6)
			}
			line := fmt.Sprintf("client %d [%.1fms, %s] %s", o.client, float64(o.call)/1e6, ret, counterModel.DescribeOperation(o.in, o.out))
			if o.err != "" {
				line += " (" + o.err + ")"
			}
			res.History = append(res.History, line)
		}
		break
	}
	return res
}
