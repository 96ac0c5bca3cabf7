package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/mongocas/mongocas/store"
)

// clockReading is one reading of the server's clock by one client: when (on
// the local monotonic clock, since the run began), the server clock's offset
// from the local one then, and the reading's error bound.
type clockReading struct {
	at, offset, bound time.Duration
}

// clockFigures is what the clients' readings of the server clock showed.
type clockFigures struct {
	Readings int `json:"readings"`
	// OffsetMS is the server clock's offset from this host's clock
	// (harmless by itself: only differences are used).
	OffsetMS float64 `json:"offsetMs"`
	// SpreadMS is how far apart the clients' latest offsets are;
	// AllowedSpreadMS is the lease's safety margin, which the spread may
	// not exceed beyond the readings' error bounds.
	SpreadMS        float64 `json:"spreadMs"`
	AllowedSpreadMS float64 `json:"allowedSpreadMs"`
	// Rate is the fastest rate at which a client saw the server's clock
	// gain on (or lose to) the local one, RateError its error bound;
	// AllowedRate is lease's DriftRate.
	Rate        float64 `json:"rate"`
	RateError   float64 `json:"rateError"`
	AllowedRate float64 `json:"allowedRate"`
}

func (f clockFigures) String() string {
	if f.Readings == 0 {
		return "no reading of the server clock"
	}
	offset := fmt.Sprintf("%+.1fms", f.OffsetMS)
	if math.Abs(f.OffsetMS) >= 1000 {
		d := time.Duration(f.OffsetMS * float64(time.Millisecond)).Round(time.Millisecond)
		if offset = d.String(); d > 0 {
			offset = "+" + offset
		}
	}
	return fmt.Sprintf("offset %s from this host, spread %.1fms between clients (allowed %.0fms), "+
		"rate %+.2g ±%.1g (allowed %.0e), %d readings",
		offset, f.SpreadMS, f.AllowedSpreadMS, f.Rate, f.RateError, f.AllowedRate, f.Readings)
}

// clocks reads the server's clock (hello's localTime, as store.ServerClock
// does) from every client throughout the run, the clients' readings
// staggered as their resyncs are in production. The clients must agree on
// it within the lease's safety margin, and it must not run faster or slower
// than the local clock by more than DriftRate: the lease's deadlines assume
// both.
func (v *verifier) clocks(ctx context.Context) checkResult {
	res := checkResult{Name: "clock: the clients agree on the server's clock, which keeps time", Kind: "guarantee"}
	n := len(v.clients)
	period := max(250*time.Millisecond, time.Until(v.until)/20)
	all := make([][]clockReading, n)
	var wg sync.WaitGroup
	for i, db := range v.clients {
		sample := store.HelloSampler(db.Client())
		wg.Go(func() {
			next := time.Duration(i) * period / time.Duration(n)
			for ctx.Err() == nil {
				at := v.start.Add(next)
				if at.After(v.until) {
					return
				}
				time.Sleep(time.Until(at))
				if r, ok := v.readClock(ctx, sample); ok {
					all[i] = append(all[i], r)
				}
				next += period
			}
		})
	}
	wg.Wait()
	var f clockFigures
	f, res.Result, res.Detail = judgeClock(all)
	v.clock = f
	return res
}

// judgeClock judges the clients' readings of the server clock (one list per
// client, in time order): the figures, the result and its detail.
func judgeClock(all [][]clockReading) (f clockFigures, result, detail string) {
	f = clockFigures{AllowedSpreadMS: ms(leaseMargin), AllowedRate: driftRate}
	var rateWorst, errWorst float64
	var latest []clockReading
	var sum time.Duration
	for i, rs := range all {
		f.Readings += len(rs)
		if len(rs) < 2 {
			return f, notTestable, fmt.Sprintf("client %d took %d readings of the server clock: raise --duration", i, len(rs))
		}
		for _, r := range rs {
			sum += r.offset
		}
		// The rate from the best reading of the first third to the best of
		// the last third, with its error bound.
		third := max(len(rs)/3, 1)
		a, b := best(rs[:third]), best(rs[len(rs)-third:])
		dt := (b.at - a.at).Seconds()
		if dt <= 0 {
			continue
		}
		rate := (b.offset - a.offset).Seconds() / dt
		rerr := (a.bound + b.bound).Seconds() / dt
		if math.Abs(rate)-rerr > math.Abs(rateWorst)-errWorst || i == 0 {
			rateWorst, errWorst = rate, rerr
		}
		latest = append(latest, rs[len(rs)-1])
	}
	f.OffsetMS = ms(sum / time.Duration(f.Readings))
	f.Rate, f.RateError = rateWorst, errWorst
	var spreadWorst, spread time.Duration
	for _, a := range latest {
		for _, b := range latest {
			spread = max(spread, a.offset-b.offset)
			// Readings taken at different times differ by the drift
			// between them too; allowed for at DriftRate.
			allowance := a.bound + b.bound + time.Duration(driftRate*float64(absDur(a.at-b.at)))
			spreadWorst = max(spreadWorst, a.offset-b.offset-allowance)
		}
	}
	f.SpreadMS = ms(spread)
	var bad []string
	if spreadWorst > leaseMargin {
		bad = append(bad, fmt.Sprintf("the clients' readings of the server clock are %.1fms apart (%.1fms beyond their error bounds), "+
			"more than the lease's safety margin (%v): a holder may still write when another client sees its lease expired",
			f.SpreadMS, ms(spreadWorst), leaseMargin))
	}
	if math.Abs(rateWorst)-errWorst > driftRate {
		bad = append(bad, fmt.Sprintf("the server clock runs at %+.2g (±%.1g) against this host's, beyond lease's DriftRate %.0e: "+
			"deadlines estimated from it are wrong by up to %.0fms per %v of TTL", rateWorst, errWorst, driftRate,
			math.Abs(rateWorst)*ms(leaseTTL), leaseTTL))
	}
	if len(bad) > 0 {
		return f, broken, strings.Join(bad, "; ")
	}
	return f, held, f.String()
}

// readClock takes up to three readings and keeps the one with the
// smallest round trip.
func (v *verifier) readClock(ctx context.Context, sample store.Sampler) (clockReading, bool) {
	var out clockReading
	ok := false
	for range 3 {
		t0 := time.Since(v.start)
		server, err := sample(ctx)
		t1 := time.Since(v.start)
		v.ops.Add(1)
		if err != nil {
			continue
		}
		mid := t0 + (t1-t0)/2
		// localTime has a resolution of 1 ms.
		r := clockReading{at: mid, offset: server.Sub(v.start.Add(mid)), bound: (t1-t0)/2 + time.Millisecond}
		if !ok || r.bound < out.bound {
			out, ok = r, true
		}
	}
	return out, ok
}

func best(rs []clockReading) clockReading {
	b := rs[0]
	for _, r := range rs[1:] {
		if r.bound < b.bound {
			b = r
		}
	}
	return b
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
