package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/anishathalye/porcupine"
)

// Outcomes of a call, as the history records them.
const (
	resOK      byte = 'o' // applied (or read), with the document's n after it
	resFail    byte = 'f' // a definite failure: nothing was written
	resGuard   byte = 'g' // Guarded's condition did not hold: nothing was written
	resUnknown byte = 'u' // it may or may not have applied, at any time after its call
)

// never is the return time of a call whose outcome is unknown.
const never = math.MaxInt64

// vIn is a call on one document: 'm' Modify +1, 't' Guarded -1 if n ≥ 1,
// 'g' Get.
type vIn struct {
	Key string
	Op  byte
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
	Init: func() []any { return []any{int64(initN)} },
	Step: func(state, input, output any) []any {
		s, in, out := as[int64](state), as[vIn](input), as[vOut](output)
		switch in.Op {
		case 'g':
			if out.N == s {
				return []any{s}
			}
		case 'm':
			switch out.Res {
			case resOK:
				if out.N == s+1 {
					return []any{s + 1}
				}
			case resFail, resGuard:
				return []any{s}
			case resUnknown:
				return []any{s, s + 1}
			}
		case 't':
			switch out.Res {
			case resOK:
				if s >= 1 && out.N == s-1 {
					return []any{s - 1}
				}
			case resGuard:
				if s < 1 {
					return []any{s}
				}
			case resFail:
				return []any{s}
			case resUnknown:
				if s >= 1 {
					return []any{s, s - 1}
				}
				return []any{s}
			}
		}
		return nil
	},
	Equal: func(a, b any) bool { return as[int64](a) == as[int64](b) },
	DescribeOperation: func(input, output any) string {
		in, out := as[vIn](input), as[vOut](output)
		call := map[byte]string{'g': "get()", 'm': "modify(+1)", 't': "guarded(-1 if n ≥ 1)"}[in.Op]
		switch out.Res {
		case resOK:
			return fmt.Sprintf("%s %s → n=%d", in.Key, call, out.N)
		case resGuard:
			return fmt.Sprintf("%s %s → guard failed", in.Key, call)
		case resFail:
			return fmt.Sprintf("%s %s → failed, nothing written", in.Key, call)
		}
		return fmt.Sprintf("%s %s → outcome unknown", in.Key, call)
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
	unknown := 0
	docs := map[string]bool{}
	for _, o := range h {
		docs[o.in.Key] = true
		if o.out.Res == resUnknown {
			unknown++
		}
	}
	switch porcupine.CheckOperationsTimeout(model, toPorcupine(h), limit) {
	case porcupine.Ok:
		res.Result = held
		res.Detail = fmt.Sprintf("%d operations on %d documents linearizable (porcupine); %d of unknown outcome", len(h), len(docs), unknown)
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
