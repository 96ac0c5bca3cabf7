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

	"github.com/mongocas/mongocas/store"
)

// The scenario names.
const (
	ScenarioInventory = "inventory"
	ScenarioWallet    = "wallet"
	ScenarioIdentity  = "identity"
)

// Config sizes the demo: which scenarios run, and each one's size.
type Config struct {
	// Scenarios lists the scenarios to run, in order. Default all three.
	Scenarios []string
	Inventory InventoryConfig
	Wallet    WalletConfig
	Identity  IdentityConfig
	// Seed, when not 0, replaces the scenarios' own seeds.
	Seed uint64
	// Progress, if not nil, receives a line now and then during a long run
	// (it is copied into each scenario's config).
	Progress io.Writer
}

// RegisterFlags registers the flags of the named scenarios on fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet, scenarios ...string) {
	for _, s := range scenarios {
		switch s {
		case ScenarioInventory:
			fs.IntVar(&c.Inventory.Buyers, "buyers", 50, "inventory: concurrent buyers, one item each")
			fs.IntVar(&c.Inventory.Items, "items", 10, "inventory: items in stock at the start")
			fs.IntVar(&c.Inventory.Concurrency, "buyer-concurrency", 0, "inventory: buyers shopping at once (0: all)")
		case ScenarioWallet:
			fs.IntVar(&c.Wallet.Wallets, "wallets", 4, "wallet: wallets the operations share")
			fs.IntVar(&c.Wallet.Operations, "ops", 300, "wallet: debits and credits")
			fs.IntVar(&c.Wallet.Transfers, "transfers", 75, "wallet: transfers, where the server has transactions")
			fs.IntVar(&c.Wallet.Concurrency, "wallet-concurrency", 8, "wallet: operations at once")
		case ScenarioIdentity:
			fs.IntVar(&c.Identity.Users, "users", 12, "identity: users switching their primary identity")
			fs.IntVar(&c.Identity.Switches, "switches", 3, "identity: concurrent switches per user")
			fs.DurationVar(&c.Identity.LatencyMin, "latency-min", 20*time.Millisecond, "identity: partner latency, lower bound")
			fs.DurationVar(&c.Identity.LatencyMax, "latency-max", 80*time.Millisecond, "identity: partner latency, upper bound")
			fs.Float64Var(&c.Identity.FailureRate, "failure-rate", 0.1, "identity: share of partner calls answered 503 (negative: none)")
			fs.DurationVar(&c.Identity.LeaseTTL, "lease-ttl", 5*time.Second, "identity: lease TTL")
		}
	}
	fs.Uint64Var(&c.Seed, "seed", 1, "seed of the generated operations and of the partner's latencies and failures")
	c.Scenarios = scenarios
}

// Report is what the demo found.
type Report struct {
	// Rows holds one row per strategy that ran.
	Rows []Row
	// Skipped holds one line per strategy the server could not run.
	Skipped []string
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

// RunDemo runs the configured scenarios, each strategy side by side, on db
// (caps says what its server can do) and prints the table and the details to
// out. It returns an error only when a scenario could not be run at all.
func RunDemo(ctx context.Context, db *mongo.Database, caps store.Capabilities, cfg Config, out io.Writer) (*Report, error) {
	if len(cfg.Scenarios) == 0 {
		cfg.Scenarios = []string{ScenarioInventory, ScenarioWallet, ScenarioIdentity}
	}
	cfg.Inventory.Progress, cfg.Wallet.Progress, cfg.Identity.Progress = cfg.Progress, cfg.Progress, cfg.Progress
	if cfg.Seed != 0 {
		cfg.Wallet.Seed, cfg.Identity.Seed = cfg.Seed, cfg.Seed
	}
	rep := &Report{}
	for _, sc := range cfg.Scenarios {
		var err error
		switch sc {
		case ScenarioInventory:
			err = runEach(rep, sc, "", []InventoryStrategy{InventoryNaive, InventoryGuarded},
				func(s InventoryStrategy) (*InventoryResult, error) { return RunInventory(ctx, db, s, cfg.Inventory) })
		case ScenarioWallet:
			err = runEach(rep, sc, ", and a transfer is never faked with two independent writes", []WalletStrategy{WalletNaive, WalletModify, WalletTransfer},
				func(s WalletStrategy) (*WalletResult, error) {
					return RunWallet(ctx, db, s, caps.Transactions, cfg.Wallet)
				})
		case ScenarioIdentity:
			err = runEach(rep, sc, ", so the anti-pattern cannot be shown", []IdentityStrategy{IdentityNoLock, IdentityLease, IdentityTxAcrossHTTP},
				func(s IdentityStrategy) (*IdentityResult, error) {
					return RunIdentity(ctx, db, s, caps.Transactions, cfg.Identity)
				})
		default:
			err = fmt.Errorf("unknown scenario %q (want %s, %s or %s)", sc, ScenarioInventory, ScenarioWallet, ScenarioIdentity)
		}
		if err != nil {
			return rep, err
		}
	}
	rep.Print(out)
	return rep, nil
}

// runEach runs each strategy of one scenario and adds its row to rep, or a
// skipped line (ending in why) when the server lacks transactions.
func runEach[S ~string, R interface{ Summary() Row }](rep *Report, scenario, why string, strategies []S, run func(S) (R, error)) error {
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
