package scenario

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/observe"
	"github.com/mongocas/mongocas/store"
)

// Scenario is one job a program runs, each strategy side by side: the
// harness's own naive strategy beside the program's mongocas one.
type Scenario interface {
	// Name is the scenario's name: "inventory", "wallet" or "identity".
	Name() string
	// RegisterFlags registers the scenario's sizes as flags on fs.
	RegisterFlags(fs *flag.FlagSet)
	// Run runs each strategy on a fresh collection of env.DB and adds its
	// row, or a line saying why it was skipped, to rep. It returns an error
	// only when the scenario could not be run at all.
	Run(ctx context.Context, env Env, rep *Report) error
}

// Env is what a scenario runs on.
type Env struct {
	// DB is a fresh database.
	DB *mongo.Database
	// Caps is what its server can do.
	Caps store.Capabilities
	// Seed, when not 0, replaces the scenario's own seed.
	Seed uint64
	// Progress, if not nil, receives a line now and then during a long run.
	Progress io.Writer
	// URI is the server's connection string, for strategies that run
	// several instances of a service, each with a client of its own. Never
	// print it: it may hold a password.
	URI string
}

// Report is what the scenarios found. The demo merges the reports of the
// example programs (which print them as JSON with -json), so whatever a
// scenario adds must survive encoding/json.
type Report struct {
	// Rows holds one row per strategy that ran.
	Rows []Row `json:"rows"`
	// Skipped holds one line per strategy the server could not run.
	Skipped []string `json:"skipped"`
	// Events counts what the mongocas strategies' repositories and lease
	// managers reported to their observe.Counters during the run, nil if
	// none.
	Events *observe.Counts `json:"events,omitempty"`
}

// AddEvents adds the counts of c to the report's Events.
func (r *Report) AddEvents(c observe.Counts) {
	if r.Events != nil {
		c = r.Events.Add(c)
	}
	r.Events = &c
}

// OK reports whether every mongocas strategy ran without anomaly or
// unexpected error.
func (r *Report) OK() bool {
	for _, row := range r.Rows {
		if row.Mongocas() && !row.OK() {
			return false
		}
	}
	return true
}

// runEach runs each strategy of one scenario and adds its row to rep, or a
// skipped line (ending in why) when the server lacks transactions.
func runEach[S fmt.Stringer, R interface{ Summary() Row }](rep *Report, scenario, why string, strategies []S, run func(S) (R, error)) error {
	for _, s := range strategies {
		r, err := run(s)
		switch {
		case errors.Is(err, ErrNoTransactions):
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s / %s: skipped: %v%s.", scenario, s, err, why))
		case err != nil:
			return err
		default:
			rep.Rows = append(rep.Rows, r.Summary())
		}
	}
	return nil
}

// Print writes the table, the details and the verdict.
func (r *Report) Print(out io.Writer) {
	cells := make([][]string, 0, 1+len(r.Rows))
	cells = append(cells, []string{"scenario", "strategy", "kind", "requests", "anomalies", "p50", "p99"})
	for _, row := range r.Rows {
		cells = append(cells, []string{row.Scenario, row.Strategy, row.Kind,
			strconv.Itoa(row.Requests), strconv.Itoa(row.Anomalies), ms(row.Latency.P50), ms(row.Latency.P99)})
	}
	printTable(out, cells, 3)
	last := ""
	for _, row := range r.Rows {
		if row.Scenario != last {
			fmt.Fprintf(out, "\n%s\n", row.Scenario)
			last = row.Scenario
		}
		for i, d := range row.Details {
			lead := "    "
			if i == 0 {
				lead = "  " + row.Strategy + ": "
			}
			fmt.Fprintf(out, "%s%s\n", lead, d)
		}
	}
	if len(r.Skipped) > 0 {
		fmt.Fprintln(out)
		for _, s := range r.Skipped {
			fmt.Fprintln(out, s)
		}
	}
	if r.Events != nil {
		fmt.Fprintf(out, "\nwhat mongocas reported (observe.Counters):\n  %s\n", r.Events)
	}
	fmt.Fprintln(out)
	var naiveBad, naive int
	var bad []string
	for _, row := range r.Rows {
		switch {
		case row.Mongocas() && !row.OK():
			bad = append(bad, fmt.Sprintf("%s/%s (%d anomalies, %d errors)", row.Scenario, row.Strategy, row.Anomalies, row.Errors))
		case !row.Mongocas():
			naive++
			if row.Anomalies > 0 {
				naiveBad++
			}
		}
	}
	if len(bad) > 0 {
		fmt.Fprintf(out, "FAIL: a mongocas strategy went wrong: %s\n", strings.Join(bad, "; "))
		return
	}
	fmt.Fprintf(out, "ok: no mongocas strategy showed an anomaly or an error; %d of %d other strategies showed anomalies.\n", naiveBad, naive)
}

// printTable writes cells as columns, the first left columns aligned left
// and the others right.
func printTable(out io.Writer, cells [][]string, left int) {
	var width []int
	for _, row := range cells {
		for i, c := range row {
			if i >= len(width) {
				width = append(width, 0)
			}
			width[i] = max(width[i], utf8.RuneCountInString(c))
		}
	}
	for _, row := range cells {
		var b strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i > 0 {
				b.WriteString("  ")
			}
			if i < left {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		fmt.Fprintln(out, strings.TrimRight(b.String(), " "))
	}
}

// ms formats a latency in milliseconds.
func ms(d time.Duration) string {
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%dms", d.Milliseconds())
}
