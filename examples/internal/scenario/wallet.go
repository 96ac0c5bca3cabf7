package scenario

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/store"
)

// Wallet (seed 004): many debits and credits at once on a few balances.
//
// The naive operation reads the balance, computes the new one in the
// application and $sets it: two operations that read the same balance both
// write their own result, and one of them is lost, so money is created or
// destroyed. The mongocas operation, in examples/wallet/main.go, is
// versioned's read-modify-write: the write is conditional on the version read, and a conflict is retried on a
// fresh read with jittered backoff, so every acknowledged change lands
// exactly once. A transfer between two wallets changes two documents and
// needs a transaction; it runs only where the server has them.

// Wallets is a wallet service: the code under test in the wallet scenario.
type Wallets interface {
	// Create stores a new wallet with an opening balance in cents.
	Create(ctx context.Context, id, owner string, balance int64) error
	// Change credits (delta > 0) or debits (delta < 0) a wallet. It
	// returns nil when the change is made, an error matching the strategy's
	// Insufficient when a debit would take the balance below zero (and
	// nothing is written), and any other error when it failed.
	Change(ctx context.Context, id string, delta int64) error
	// Transfer moves amount from one wallet to another: both change or
	// neither. Only strategies with Transfers call it.
	Transfer(ctx context.Context, from, to string, amount int64) error
	// ConflictsRetried is how many times a version conflict (or a
	// transaction's write conflict) made the service start a change again.
	ConflictsRetried() int64
}

// WalletStrategy is a way to change balances.
type WalletStrategy struct {
	// Name names it in the table.
	Name string
	// Kind is KindNaive or KindMongocas.
	Kind string
	// Open returns the service on an empty collection.
	Open func(coll *mongo.Collection) (Wallets, error)
	// Insufficient is the error Change and Transfer return for a debit the
	// balance does not cover.
	Insufficient error
	// Transfers adds WalletConfig.Transfers transfers to the operations.
	// They need multi-document transactions: where the server has none, the
	// run is refused with ErrNoTransactions.
	Transfers bool
	// Instances runs the service as that many instances (a service's
	// replicas), each opened on a client of its own (WalletConfig.URI), the
	// operations spread over them. 0 or 1 means one, on the scenario's
	// client.
	Instances int
}

// Deferring is a wallet service that queues a change it cannot make now
// (its conflict retries ran out) and applies it later, exactly once. When
// a strategy's service implements it, the scenario calls ChangeLater
// instead of Change, then waits for every queued change's Outcome.
type Deferring interface {
	// ChangeLater is Change, except that a change the service cannot make
	// now is queued: it returns the queued job's id then, and nil.
	ChangeLater(ctx context.Context, id string, delta int64) (job string, err error)
	// Outcome waits for a queued change to end: nil when it was applied,
	// an error matching the strategy's Insufficient when it was refused
	// when its turn came, another error when it failed.
	Outcome(ctx context.Context, job string) error
}

// String returns the strategy's name.
func (s WalletStrategy) String() string { return s.Name }

// WalletNaive reads the balance and $sets the computed one.
var WalletNaive = WalletStrategy{
	Name:         "naive read, compute, $set",
	Kind:         KindNaive,
	Open:         func(coll *mongo.Collection) (Wallets, error) { return naiveWallets{coll}, nil },
	Insufficient: errInsufficient,
}

// WithTransfers returns s named "transfer in a transaction", with
// transfers among its operations.
func WithTransfers(s WalletStrategy) WalletStrategy {
	s.Name, s.Transfers = "transfer in a transaction", true
	return s
}

// Wallet is the wallet scenario: WalletNaive, then the program's service
// with debits and credits only, then its fallback service (if any), then the
// service with transfers (where the server has transactions).
type Wallet struct {
	// Config sizes the run; RegisterFlags binds it to flags.
	Config WalletConfig
	// Mongocas is the program's service.
	Mongocas WalletStrategy
	// Fallback, if its Open is set, is the program's service that queues
	// the changes it cannot make now (a Deferring), run under a conflict
	// storm of several instances.
	Fallback WalletStrategy
}

// Name returns "wallet".
func (*Wallet) Name() string { return "wallet" }

// RegisterFlags registers the scenario's sizes on fs.
func (sc *Wallet) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&sc.Config.Wallets, "wallets", 4, "wallet: wallets the operations share")
	fs.IntVar(&sc.Config.Operations, "ops", 300, "wallet: debits and credits")
	fs.IntVar(&sc.Config.Transfers, "transfers", 75, "wallet: transfers, where the server has transactions")
	fs.IntVar(&sc.Config.Concurrency, "wallet-concurrency", 8, "wallet: operations at once")
}

// Run runs WalletNaive, sc.Mongocas and WithTransfers(sc.Mongocas).
func (sc *Wallet) Run(ctx context.Context, env Env, rep *Report) error {
	cfg := sc.Config
	cfg.Progress, cfg.URI = env.Progress, env.URI
	if env.Seed != 0 {
		cfg.Seed = env.Seed
	}
	strategies := []WalletStrategy{WalletNaive, sc.Mongocas}
	if sc.Fallback.Open != nil {
		strategies = append(strategies, sc.Fallback)
	}
	return runEach(rep, sc.Name(), ", and a transfer is never faked with two independent writes",
		append(strategies, WithTransfers(sc.Mongocas)),
		func(s WalletStrategy) (*WalletResult, error) {
			return RunWallet(ctx, env.DB, s, env.Caps.Transactions, cfg)
		})
}

// WalletConfig sizes a wallet run. Zero fields take their defaults.
type WalletConfig struct {
	// Wallets is how many balances the operations share. Default 4.
	Wallets int
	// Operations is how many debits and credits are made. Default 300.
	Operations int
	// Transfers is how many transfers WalletTransfer makes besides the
	// operations. Default Operations/4.
	Transfers int
	// Concurrency is how many operations run at once. Default 8.
	Concurrency int
	// Opening is every wallet's opening balance, in cents. Default 5000.
	Opening int64
	// MaxAmount bounds each debit, credit or transfer, in cents. Default
	// 2500.
	MaxAmount int64
	// Seed makes the operations repeatable.
	Seed uint64
	// Progress, if not nil, receives a line now and then during a long run.
	Progress io.Writer
	// URI is the server's connection string, for a strategy with
	// Instances; never printed.
	URI string
}

func (c WalletConfig) withDefaults() WalletConfig {
	if c.Wallets <= 0 {
		c.Wallets = 4
	}
	if c.Operations <= 0 {
		c.Operations = 300
	}
	if c.Transfers <= 0 {
		c.Transfers = max(c.Operations/4, 1)
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.Opening <= 0 {
		c.Opening = 5000
	}
	if c.MaxAmount <= 0 {
		c.MaxAmount = 2500
	}
	return c
}

// WalletResult is what a wallet run did.
type WalletResult struct {
	Row
	// Acknowledged is how many operations (and transfers) the caller was
	// told succeeded; Declined how many were refused for insufficient funds.
	Acknowledged, Declined int
	// Queued is how many changes a Deferring service queued, of which
	// QueuedApplied were applied later and QueuedDeclined refused when
	// their turn came (both are also in Acknowledged and Declined).
	Queued, QueuedApplied, QueuedDeclined int
	// ConflictsRetried is how many times a version conflict made
	// versioned.Modify (or a transaction) start again.
	ConflictsRetried int64
	// Expected is, per wallet, the opening balance plus the acknowledged
	// changes; Actual the stored balance.
	Expected, Actual []int64
	// ExpectedTotal and ActualTotal sum them.
	ExpectedTotal, ActualTotal int64
	// WrongWallets is how many wallets hold another balance than expected,
	// or a negative one.
	WrongWallets int
}

// errInsufficient declines a debit that would take a balance below zero.
var errInsufficient = errors.New("insufficient funds")

// walletOp is a debit (negative) or credit (positive) on one wallet, or a
// transfer of amount from one wallet to another.
type walletOp struct {
	wallet, to int
	delta      int64
	transfer   bool
}

// ErrNoTransactions is returned by RunWallet for a strategy with Transfers,
// and by RunIdentity for IdentityTxAcrossHTTP, when the server has no
// multi-document transactions. A transfer is never faked with two
// independent writes.
var ErrNoTransactions = errors.New("this server has no multi-document transactions")

// RunWallet runs one wallet strategy on a fresh collection of db.
// transactions says whether the server has them (store.Capabilities).
func RunWallet(ctx context.Context, db *mongo.Database, s WalletStrategy, transactions bool, cfg WalletConfig) (*WalletResult, error) {
	cfg = cfg.withDefaults()
	if s.Open == nil || s.Insufficient == nil {
		return nil, fmt.Errorf("wallet: strategy %q has no Open or no Insufficient", s.Name)
	}
	if s.Transfers && !transactions {
		return nil, ErrNoTransactions
	}
	coll := db.Collection("wallets_" + slug(s.Name))
	if err := coll.Drop(ctx); err != nil {
		return nil, fmt.Errorf("wallet: drop: %w", err)
	}
	svcs, closeAll, err := openInstances(ctx, db, coll, s, cfg.URI)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	svc := svcs[0]
	ids := make([]string, cfg.Wallets)
	for i := range ids {
		ids[i] = fmt.Sprintf("wallet-%02d", i+1)
		if err := svc.Create(ctx, ids[i], fmt.Sprintf("user %d", i+1), cfg.Opening); err != nil {
			return nil, fmt.Errorf("wallet: create: %w", err)
		}
	}

	rng := rand.New(rand.NewPCG(cfg.Seed, 0x3a11e7))
	var ops []walletOp
	for range cfg.Operations {
		amount := 1 + rng.Int64N(cfg.MaxAmount)
		if rng.IntN(2) == 0 {
			amount = -amount
		}
		ops = append(ops, walletOp{wallet: rng.IntN(cfg.Wallets), delta: amount})
	}
	if s.Transfers && cfg.Wallets > 1 {
		for range cfg.Transfers {
			from := rng.IntN(cfg.Wallets)
			to := (from + 1 + rng.IntN(cfg.Wallets-1)) % cfg.Wallets
			ops = append(ops, walletOp{wallet: from, to: to, delta: 1 + rng.Int64N(cfg.MaxAmount), transfer: true})
		}
		rng.Shuffle(len(ops), func(i, j int) { ops[i], ops[j] = ops[j], ops[i] })
	}
	jobs := make([]string, len(ops)) // the queued changes' jobs, by op
	apply := func(ctx context.Context, i int, op walletOp) error {
		svc := svcs[i%len(svcs)]
		if op.transfer {
			return svc.Transfer(ctx, ids[op.wallet], ids[op.to], op.delta)
		}
		if d, ok := svc.(Deferring); ok {
			job, err := d.ChangeLater(ctx, ids[op.wallet], op.delta)
			jobs[i] = job
			return err
		}
		return svc.Change(ctx, ids[op.wallet], op.delta)
	}

	warmUp(ctx, db, cfg.Concurrency)
	res := &WalletResult{Row: Row{Scenario: "wallet", Strategy: s.Name, Kind: s.Kind, Requests: len(ops)}}
	outcomes := make([]error, len(ops))
	var rec recorder
	start := time.Now()
	p := startProgress(cfg.Progress, "wallet/"+s.Name, len(ops))
	forEach(len(ops), cfg.Concurrency, p, func(i int) {
		rec.time(func() { outcomes[i] = apply(ctx, i, ops[i]) })
	})
	p.end()
	// The queued changes end later: wait for each (the services' queue
	// workers apply them meanwhile).
	for i, job := range jobs {
		if job == "" || outcomes[i] != nil {
			continue
		}
		d, ok := svcs[i%len(svcs)].(Deferring)
		if !ok {
			continue
		}
		res.Queued++
		outcomes[i] = d.Outcome(ctx, job)
		switch {
		case outcomes[i] == nil:
			res.QueuedApplied++
		case errors.Is(outcomes[i], s.Insufficient):
			res.QueuedDeclined++
		}
	}
	res.Elapsed, res.Latency = time.Since(start), rec.latency()
	for _, svc := range svcs {
		res.ConflictsRetried += svc.ConflictsRetried()
	}

	res.Expected = make([]int64, cfg.Wallets)
	for i := range res.Expected {
		res.Expected[i] = cfg.Opening
	}
	var firstErr error
	for i, err := range outcomes {
		op := ops[i]
		switch {
		case err == nil:
			res.Acknowledged++
			if op.transfer {
				res.Expected[op.wallet] -= op.delta
				res.Expected[op.to] += op.delta
			} else {
				res.Expected[op.wallet] += op.delta
			}
		case errors.Is(err, s.Insufficient):
			res.Declined++
		default:
			res.Errors++
			firstErr = cmp.Or(firstErr, err)
		}
	}
	res.Actual = make([]int64, cfg.Wallets)
	for i, id := range ids {
		var w struct {
			Balance int64 `bson:"balance"`
		}
		if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&w); err != nil {
			return nil, fmt.Errorf("wallet: read final balance: %w", err)
		}
		res.Actual[i] = w.Balance
		res.ExpectedTotal += res.Expected[i]
		res.ActualTotal += w.Balance
		if w.Balance != res.Expected[i] || w.Balance < 0 {
			res.WrongWallets++
		}
	}
	res.Anomalies = res.WrongWallets
	transfers, conflictsLine := "", fmt.Sprintf("%d conflicts retried", res.ConflictsRetried)
	if s.Transfers {
		transfers = fmt.Sprintf(" (%d of them transfers)", cfg.Transfers)
	}
	if s.Kind == KindNaive {
		conflictsLine = "conflicts go unseen"
	}
	res.Details = append(res.Details,
		fmt.Sprintf("%d operations%s on %d wallets: %d acknowledged, %d declined for insufficient funds, %s",
			len(ops), transfers, cfg.Wallets, res.Acknowledged, res.Declined, conflictsLine),
		fmt.Sprintf("expected total %s, actual %s%s; %d of %d wallets wrong",
			money(res.ExpectedTotal), money(res.ActualTotal), createdOrDestroyed(res.ActualTotal-res.ExpectedTotal), res.WrongWallets, cfg.Wallets))
	if len(svcs) > 1 {
		res.Details = append(res.Details, fmt.Sprintf("%d instances of the service, each with a client of its own, changing the same wallets at once", len(svcs)))
	}
	if _, ok := svc.(Deferring); ok {
		res.Details = append(res.Details, fmt.Sprintf("applied now %d, queued and applied later %d, failed %d (declined now %d, declined when their turn came %d, errors %d)",
			res.Acknowledged-res.QueuedApplied, res.QueuedApplied, res.Declined+res.Errors, res.Declined-res.QueuedDeclined, res.QueuedDeclined, res.Errors))
	}
	if firstErr != nil {
		res.Details = append(res.Details, fmt.Sprintf("%d requests failed, first: %v", res.Errors, firstErr))
	}
	return res, nil
}

// openInstances opens s's service on coll, or, for s.Instances > 1, that
// many services, each on the same collection through a client of its own
// connected to uri. The function returned closes the services that have a
// Close method (a queue's workers) and disconnects the clients.
func openInstances(ctx context.Context, db *mongo.Database, coll *mongo.Collection, s WalletStrategy, uri string) ([]Wallets, func(), error) {
	var svcs []Wallets
	var closers []func()
	closeAll := func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}
	open := func(c *mongo.Collection) error {
		svc, err := s.Open(c)
		if err != nil {
			return err
		}
		svcs = append(svcs, svc)
		if cl, ok := svc.(interface{ Close() }); ok {
			closers = append(closers, cl.Close)
		}
		return nil
	}
	if err := open(coll); err != nil {
		return nil, nil, err
	}
	for i := 1; i < s.Instances; i++ {
		if uri == "" {
			closeAll()
			return nil, nil, fmt.Errorf("wallet: %s runs %d instances and needs the server's URI", s.Name, s.Instances)
		}
		st, err := store.Connect(ctx, uri, &store.Options{AppName: fmt.Sprintf("mongocas-examples-%d", i+1)})
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("wallet: connect instance %d: %w", i+1, err)
		}
		closers = append(closers, func() { _ = st.Close(context.WithoutCancel(ctx)) })
		if err := open(st.Database(db.Name()).Collection(coll.Name())); err != nil {
			closeAll()
			return nil, nil, err
		}
	}
	return svcs, closeAll, nil
}

// naiveWallets is seed 004's lost update: read, compute, $set.
type naiveWallets struct{ coll *mongo.Collection }

func (n naiveWallets) Create(ctx context.Context, id, owner string, balance int64) error {
	_, err := n.coll.InsertOne(ctx, bson.D{{Key: "_id", Value: id}, {Key: "owner", Value: owner}, {Key: "balance", Value: balance}})
	return err
}

func (n naiveWallets) Change(ctx context.Context, id string, delta int64) error {
	var w struct {
		Balance int64 `bson:"balance"`
	}
	if err := n.coll.FindOne(ctx, bson.D{{Key: "_id", Value: id}}).Decode(&w); err != nil {
		return err
	}
	if w.Balance+delta < 0 {
		return errInsufficient
	}
	_, err := n.coll.UpdateOne(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "balance", Value: w.Balance + delta}}}})
	return err
}

// Transfer is refused: the naive way has no transfers to fake.
func (naiveWallets) Transfer(context.Context, string, string, int64) error {
	return errors.New("wallet: the naive strategy makes no transfers")
}

// ConflictsRetried is 0: the naive way never sees a conflict.
func (naiveWallets) ConflictsRetried() int64 { return 0 }

// money formats cents.
func money(c int64) string {
	sign := ""
	if c < 0 {
		sign, c = "-", -c
	}
	return fmt.Sprintf("%s%d.%02d", sign, c/100, c%100)
}

func createdOrDestroyed(d int64) string {
	switch {
	case d > 0:
		return fmt.Sprintf(" (%s created from nothing)", money(d))
	case d < 0:
		return fmt.Sprintf(" (%s destroyed)", money(-d))
	}
	return ""
}
