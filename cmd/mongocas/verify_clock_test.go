package main

import (
	"strings"
	"testing"
	"time"
)

// readings returns n readings of one client, one every 250 ms from at0,
// with the given offset at at0, gaining rate per second, each bound 1.5 ms.
func readings(n int, at0, offset time.Duration, rate float64) []clockReading {
	rs := make([]clockReading, n)
	for i := range rs {
		at := at0 + time.Duration(i)*250*time.Millisecond
		rs[i] = clockReading{at: at, offset: offset + time.Duration(rate*float64(at)), bound: 1500 * time.Microsecond}
	}
	return rs
}

// TestJudgeClock: the clock check fails a client whose reading of the
// server clock is apart from the others' by more than the lease's safety
// margin, and a clock that gains faster than DriftRate, naming the numbers;
// agreeing clocks (any common offset) and a drift within the reading error
// hold; too few readings are not a pass.
func TestJudgeClock(t *testing.T) {
	const n = 80 // 20 s of readings
	cases := []struct {
		name, result, detail string
		all                  [][]clockReading
	}{
		{"agreeing, an hour ahead", held, "offset +1h0m0", [][]clockReading{
			readings(n, 0, time.Hour, 0), readings(n, 100*time.Millisecond, time.Hour+time.Millisecond, 0)}},
		{"one client 300 ms apart", broken, "300.0ms apart", [][]clockReading{
			readings(n, 0, 0, 0), readings(n, 100*time.Millisecond, 300*time.Millisecond, 0)}},
		{"a spread within the margin", held, "spread 90.0ms", [][]clockReading{
			readings(n, 0, 0, 0), readings(n, 100*time.Millisecond, 90*time.Millisecond, 0)}},
		{"10% fast", broken, "runs at +0.1 ", [][]clockReading{
			readings(n, 0, 0, 0.1), readings(n, 100*time.Millisecond, 10*time.Millisecond, 0.1)}},
		{"0.05% fast", broken, "runs at +0.0005 ", [][]clockReading{
			readings(n, 0, 0, 5e-4), readings(n, 100*time.Millisecond, 0, 5e-4)}},
		{"a drift within the reading error", held, "rate +5e-05", [][]clockReading{
			readings(n, 0, 0, 5e-5), readings(n, 100*time.Millisecond, 0, 5e-5)}},
		{"too few readings", notTestable, "client 1 took 1 readings", [][]clockReading{
			readings(n, 0, 0, 0), readings(1, 0, 0, 0)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, result, detail := judgeClock(c.all)
			if result != c.result || !strings.Contains(detail, c.detail) {
				t.Errorf("%s (%s), want %s with %q", result, detail, c.result, c.detail)
			}
		})
	}
}
