package main

import (
	"strings"
	"testing"

	"github.com/mongocas/mongocas/mongotest"
)

// TestDevReport: a server dev started is exported with its URI naming the
// database asked for, its query kept; the user's own MONGODB_URI is shown
// with its password redacted, and never exported.
func TestDevReport(t *testing.T) {
	started := &mongotest.Server{Backend: mongotest.BackendDocker, URI: "mongodb://127.0.0.1:32768/?directConnection=true"}
	info, err := devReport(started, "dev")
	if err != nil {
		t.Fatal(err)
	}
	if want := "mongodb://127.0.0.1:32768/dev?directConnection=true"; info.URI != want || info.Export != "export MONGODB_URI='"+want+"'" || !info.Started {
		t.Errorf("started: %+v, want the URI %s exported", info, want)
	}

	const pw = "n0tTheRealPassword"
	given := &mongotest.Server{Backend: mongotest.BackendURI, URI: "mongodb://ana:" + pw + "@db.example.com/app"}
	info, err = devReport(given, "dev")
	if err != nil {
		t.Fatal(err)
	}
	if info.Started || info.Export != "" || strings.Contains(info.URI+info.Server, pw) || !strings.Contains(info.URI, "db.example.com/app") {
		t.Errorf("MONGODB_URI's server: %+v, want it redacted as given, not exported", info)
	}
}
