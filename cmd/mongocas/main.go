// Command mongocas inspects and checks a MongoDB deployment used with the
// mongocas library: what the server can do and which indexes the packages
// need (doctor), the durable queue (jobs), leases (leases), idempotency keys
// (keys), and whether the library's guarantees hold on this deployment
// (verify).
//
//	go run github.com/mongocas/mongocas/cmd/mongocas@latest doctor --uri mongodb://host/app
//
// The server is named by --uri or MONGODB_URI; the database by --db or the
// URI's path. A password is never printed. Every subcommand takes --json for
// scripts. See docs/cmd.md.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/connstring"

	"github.com/mongocas/mongocas/store"
)

// Exit statuses.
const (
	exitOK      = 0
	exitProblem = 1 // a check found something wrong, or an action was not done
	exitError   = 2 // bad usage, no server, a failed operation
)

const usage = `mongocas: inspect and check a MongoDB deployment used with mongocas.

Usage:
  mongocas doctor  [--jobs C] [--leases C] [--keys C] [--fix]
  mongocas jobs    --jobs C [--limit N]                 counts, oldest available, dead jobs
  mongocas jobs    --jobs C show ID
  mongocas jobs    --jobs C requeue|cancel (ID... | --state S --kind K --key K) [--dry-run] [--yes]
  mongocas leases  [--leases C] [--coll C] [--field F]  named and document leases
  mongocas leases  release --force (--leases C NAME | --coll C ID) --owner O --epoch E [--dry-run] [--yes]
  mongocas keys    --keys C KEY [--scope S]             an idempotency key's record
  mongocas moves   --coll C [--limit N] [--stuck D]     moves in flight and their age
  mongocas verify  [--duration 20s] [--clients 4]       prove the guarantees on this deployment
  mongocas dev     [--db NAME]                          a server for development, its URI, until Ctrl-C

Common flags (every subcommand):
  --uri URI       the server (default $MONGODB_URI); its password is never printed
  --db NAME       the database (default: the URI's path)
  --timeout D     how long to wait for the server (default 10s)
  --json          machine-readable output

An id or key is a string, or "int:42", or "oid:<24 hex digits>" for other types.
Exit status: 0 all well, 1 a check found a problem or an action was not done,
2 bad usage or the server could not be used (nothing was changed), 3 (verify)
no guarantee broke but not every one could be tested.
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is the whole command, for main and for reading.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return exitError
		}
		return exitOK
	}
	cmd, rest := args[0], args[1:]
	c := &cli{stdin: stdin}
	c.out = &scrubber{w: stdout, c: c}
	c.errw = &scrubber{w: stderr, c: c}
	var err error
	switch cmd {
	case "doctor":
		err = c.doctor(ctx, rest)
	case "jobs":
		err = c.jobs(ctx, rest)
	case "leases":
		err = c.leases(ctx, rest)
	case "keys":
		err = c.keys(ctx, rest)
	case "moves":
		err = c.moves(ctx, rest)
	case "verify":
		err = c.verify(ctx, rest)
	case "dev":
		err = c.dev(ctx, rest)
	default:
		err = usageErr("unknown command %q: want doctor, jobs, leases, keys, moves, verify or dev (mongocas --help)", cmd)
	}
	if err == nil {
		return c.status
	}
	if errors.Is(err, errHelp) {
		return exitOK
	}
	var ce *cliError
	if !errors.As(err, &ce) {
		ce = &cliError{err: err, code: exitError}
	}
	msg := "mongocas " + cmd + ": " + ce.err.Error()
	if ce.fix != "" {
		msg += "\n  to fix: " + ce.fix
	}
	if c.json {
		_ = json.NewEncoder(c.out).Encode(map[string]string{"error": ce.err.Error(), "fix": ce.fix}) //nolint:errchkjson // the message goes to stderr below as well: a failed stdout write has nowhere better to go
	}
	fmt.Fprintln(c.errw, msg)
	return ce.code
}

// cli holds the common flags and the output of one run.
type cli struct {
	uri     string
	db      string
	timeout time.Duration
	json    bool

	stdin     io.Reader
	out, errw io.Writer
	secrets   []string // the URI's password, in the forms it may be printed in
	status    int      // the exit status of a run without an error
}

// cliError is an error with the fix to print under it and its exit status.
type cliError struct {
	err  error
	fix  string
	code int
}

func (e *cliError) Error() string { return e.err.Error() }
func (e *cliError) Unwrap() error { return e.err }

func usageErr(format string, a ...any) error {
	return &cliError{err: fmt.Errorf(format, a...), fix: "see mongocas --help", code: exitError}
}

func fail(err error, fix string) error { return &cliError{err: err, fix: fix, code: exitError} }

// flags returns a flag set with the common flags.
func (c *cli) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.uri, "uri", os.Getenv("MONGODB_URI"), "the server's URI (default $MONGODB_URI)")
	fs.StringVar(&c.db, "db", "", "the database (default: the URI's path)")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "how long to wait for the server")
	fs.BoolVar(&c.json, "json", false, "machine-readable output")
	return fs
}

// parse parses flags placed anywhere among the arguments and returns the
// positional ones.
func (c *cli) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
			c.help(fs)
			return nil, errHelp
		} else if err != nil {
			return nil, usageErr("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	c.learnSecrets()
	if c.timeout <= 0 {
		return nil, usageErr("--timeout must be positive")
	}
	return pos, nil
}

// errHelp is what parse returns once it printed a subcommand's help
// (-h, --help): the run ends there, with status 0.
var errHelp = errors.New("help shown")

// help prints the usage lines of fs's subcommand and its flags to stdout.
func (c *cli) help(fs *flag.FlagSet) {
	fmt.Fprintln(c.out, "Usage:")
	for l := range strings.Lines(usage) {
		if strings.HasPrefix(l, "  mongocas "+fs.Name()+" ") {
			fmt.Fprint(c.out, l)
		}
	}
	fmt.Fprintln(c.out, "\nFlags:")
	fs.SetOutput(c.out)
	fs.PrintDefaults()
}

var userinfo = regexp.MustCompile(`^mongodb(?:\+srv)?://[^@/]*?:(.*)@`)

// learnSecrets remembers the URI's password, so that no output shows it even
// if an error message of the driver quoted it.
func (c *cli) learnSecrets() {
	c.secrets = nil
	m := userinfo.FindStringSubmatch(c.uri)
	if m == nil || len(m[1]) < 3 { // too short to scrub without mangling text; RedactURI covers it
		return
	}
	c.secrets = append(c.secrets, m[1])
	if u, err := url.PathUnescape(m[1]); err == nil && u != m[1] && len(u) >= 3 {
		c.secrets = append(c.secrets, u)
	}
}

// scrubber replaces the URI's password in everything written.
type scrubber struct {
	w io.Writer
	c *cli
}

func (s *scrubber) Write(p []byte) (int, error) {
	text := string(p)
	for _, sec := range s.c.secrets {
		text = strings.ReplaceAll(text, sec, "xxxxx")
	}
	if _, err := io.WriteString(s.w, text); err != nil {
		return 0, err
	}
	return len(p), nil
}

// conn is a connection to the server and the database the command works on.
type conn struct {
	st *store.Store
	db *mongo.Database
}

func (k *conn) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = k.st.Close(ctx)
}

// connect connects within --timeout and pings the primary; it changes
// nothing on the server.
func (c *cli) connect(ctx context.Context) (*conn, error) {
	if c.uri == "" {
		return nil, fail(errors.New("no server named"), "pass --uri mongodb://host:27017/db or set MONGODB_URI")
	}
	name := c.db
	if name == "" {
		if cs, err := connstring.Parse(c.uri); err == nil {
			name = cs.Database
		}
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	st, err := store.Connect(ctx, c.uri, &store.Options{
		AppName:                "mongocas-cli",
		ConnectTimeout:         c.timeout,
		ServerSelectionTimeout: c.timeout,
	})
	if err != nil {
		return nil, connectError(err, c.timeout)
	}
	if name == "" {
		_ = st.Close(context.Background())
		return nil, fail(errors.New("no database named"), "pass --db NAME, or name it in the URI's path: mongodb://host:27017/NAME")
	}
	return &conn{st: st, db: st.Database(name)}, nil
}

// connectError says what was tried and what to do about it.
func connectError(err error, timeout time.Duration) error {
	msg := strings.ToLower(err.Error())
	tried := fmt.Sprintf("connect (timeout %v)", timeout)
	var fix string
	switch {
	case strings.Contains(msg, "auth"):
		fix = "check the user name and password in the URI (and authSource, authMechanism); " +
			"escape special characters of the password with %XX"
	case strings.Contains(msg, "pars") || strings.Contains(msg, "scheme") || strings.Contains(msg, "invalid") ||
		strings.Contains(msg, "must"):
		fix = "check the URI's syntax: mongodb://user:password@host:27017/db?options " +
			"(mongodb+srv:// for a DNS seed list); escape special characters of the password with %XX"
	default:
		fix = "check that the server is running and reachable from here at the URI's hosts and ports " +
			"(firewall, VPN, TLS options, replicaSet name), or raise --timeout"
	}
	return &cliError{err: fmt.Errorf("%s: %w", tried, err), fix: fix + "; nothing was changed", code: exitError}
}

// open connects (see connect) and returns the connection, ctx bounded by
// opCtx, and done, which ends both: the preamble of every subcommand that
// talks to the server.
func (c *cli) open(ctx context.Context) (*conn, context.Context, func(), error) {
	k, err := c.connect(ctx)
	if err != nil {
		return nil, ctx, nil, err
	}
	ctx, cancel := c.opCtx(ctx)
	return k, ctx, func() { cancel(); k.close() }, nil
}

// opCtx bounds the work after connecting.
func (c *cli) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 3*c.timeout+30*time.Second)
}

// table starts an aligned table.
func (c *cli) table() *tabwriter.Writer {
	return tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
}

func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// confirm asks on stderr and reads the answer from stdin: only "y" or "yes"
// is yes; no stdin, or an empty answer, is no.
func (c *cli) confirm(question string) bool {
	fmt.Fprintf(c.errw, "%s [y/N] ", question)
	if c.stdin == nil {
		fmt.Fprintln(c.errw)
		return false
	}
	line, err := bufio.NewReader(c.stdin).ReadString('\n')
	if err != nil && line == "" {
		fmt.Fprintln(c.errw)
		return false
	}
	a := strings.ToLower(strings.TrimSpace(line))
	return a == "y" || a == "yes"
}

// notConfirmed is the error of an action the user did not confirm.
func notConfirmed() error {
	return &cliError{err: errors.New("not confirmed: nothing was changed"),
		fix: "answer y, or pass --yes to skip the question (--dry-run shows what would change)", code: exitProblem}
}

// parseID reads an id or key given on the command line: "int:42", "oid:<hex>",
// "str:<text>", or a plain string.
func parseID(s string) (any, error) {
	switch {
	case strings.HasPrefix(s, "int:"):
		n, err := strconv.ParseInt(s[4:], 10, 64)
		if err != nil {
			return nil, usageErr("%q: not an integer after int:", s)
		}
		return n, nil
	case strings.HasPrefix(s, "oid:"):
		id, err := bson.ObjectIDFromHex(s[4:])
		if err != nil {
			return nil, usageErr("%q: not 24 hex digits after oid:", s)
		}
		return id, nil
	case strings.HasPrefix(s, "str:"):
		return s[4:], nil
	}
	return s, nil
}

// showValue prints a BSON value for people: a string as it is, others as
// extended JSON.
func showValue(v bson.RawValue) string {
	if s, ok := v.StringValueOK(); ok {
		return s
	}
	if v.Type == 0 {
		return ""
	}
	return v.String()
}

// ago formats a duration for people, rounded.
func short(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	var s string
	switch {
	case d < time.Second:
		s = d.Round(time.Millisecond).String()
	case d < time.Minute:
		s = d.Round(100 * time.Millisecond).String()
	default:
		s = d.Round(time.Second).String()
	}
	if neg {
		return "-" + s
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
