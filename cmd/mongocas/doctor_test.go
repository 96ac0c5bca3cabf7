package main_test

import (
	"regexp"
	"testing"

	"github.com/mongocas/mongocas/mongotest"
)

// TestDoctorFixSaysCreated: on a database with none of the indexes, every
// index that doctor --fix makes is reported "created", those that one
// EnsureIndexes call made for an earlier line included; the next run reports
// them "present".
func TestDoctorFixSaysCreated(t *testing.T) {
	db := mongotest.New(t)
	line := regexp.MustCompile(`(?m)^(deferred|lease|idempotency)\s+(\S+)\s+(\{[^}]*\})\s+(\S+)`)
	states := func(r result) map[string]string {
		t.Helper()
		m := map[string]string{}
		for _, l := range line.FindAllStringSubmatch(r.stdout, -1) {
			m[l[1]+" "+l[2]+" "+l[3]] = l[4]
		}
		if len(m) == 0 {
			t.Fatalf("no index lines in:\n%s", r.stdout)
		}
		return m
	}
	r := run(t, "", args(db, "doctor", "--jobs", "jobs", "--fix")...)
	wantCode(t, r, 0)
	fixed := states(r)
	t.Logf("doctor --fix:\n%s", r.stdout)
	if len(fixed) < 4 { // jobs: p, state, expireAt; the keys collection: (n, t)
		t.Fatalf("%d index lines, want the queue's 4: %v", len(fixed), fixed)
	}
	for ix, state := range fixed {
		if state != "created" && state != "not" { // "not needed"
			t.Errorf("%s: %q after --fix on an empty database, want created", ix, state)
		}
	}
	for ix, state := range states(run(t, "", args(db, "doctor", "--jobs", "jobs")...)) {
		if fixed[ix] == "created" && state != "present" {
			t.Errorf("%s: %q on the run after --fix, want present", ix, state)
		}
	}
}
