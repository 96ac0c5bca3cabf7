package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/mongocas/mongocas/move"
)

// movesReport is what mongocas moves prints: the moves whose value is in
// flight, and the records of settled moves not yet cleaned up.
type movesReport struct {
	Collection string `json:"collection"`
	// Pending is the number of pending entries, PendingAmount their sum.
	Pending       int   `json:"pending"`
	PendingAmount int64 `json:"pendingAmount"`
	// CleanUp is the number of outcome and marker records.
	CleanUp          int       `json:"awaitingCleanUp"`
	OldestPendingAge *float64  `json:"oldestPendingAgeSeconds,omitempty"`
	Stuck            int       `json:"stuck"`
	Entries          []moveRow `json:"entries"`
}

type moveRow struct {
	Move       string    `json:"move"`
	Stage      string    `json:"stage"`
	Doc        string    `json:"doc"`
	From       string    `json:"from"`
	To         string    `json:"to"`
	Amount     int64     `json:"amount"`
	Outcome    string    `json:"outcome,omitempty"`
	At         time.Time `json:"at"`
	AgeSeconds float64   `json:"ageSeconds"`
}

func (c *cli) moves(ctx context.Context, args []string) error {
	fs := c.flags("moves")
	coll := fs.String("coll", "", "the collection of the documents moved between (the one given to move.New)")
	state := fs.String("state-field", move.DefaultStateField, "the Mover's Options.StateField")
	limit := fs.Int("limit", 20, "how many records to list, oldest first")
	stuck := fs.Duration("stuck", 0, "exit 1 when a move has been pending longer than this (0: never)")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if *coll == "" {
		return usageErr("name the collection with --coll (the one given to move.New)")
	}
	if len(pos) > 0 {
		return usageErr("moves: unexpected arguments %q", pos)
	}
	if *limit < 0 || *stuck < 0 {
		return usageErr("--limit and --stuck must not be negative")
	}
	k, ctx, done, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	entries, err := move.Unsettled(ctx, k.db.Collection(*coll), *state, 0)
	if err != nil {
		if errors.Is(err, move.ErrInvalid) {
			return usageErr("%v", err)
		}
		return fail(fmt.Errorf("read the moves of %s (move.Unsettled): %w", *coll, err), "check the collection name and the user's read access")
	}
	now := time.Now()
	r := movesReport{Collection: *coll, Entries: []moveRow{}}
	for _, e := range entries {
		age := now.Sub(e.At)
		if e.Stage == move.StagePending {
			if r.Pending == 0 {
				s := age.Seconds()
				r.OldestPendingAge = &s
			}
			r.Pending++
			r.PendingAmount += e.Amount
			if *stuck > 0 && age > *stuck {
				r.Stuck++
			}
		} else {
			r.CleanUp++
		}
		if len(r.Entries) < *limit {
			r.Entries = append(r.Entries, moveRow{Move: e.Move.Hex(), Stage: string(e.Stage), Doc: showValue(e.Doc),
				From: showValue(e.From), To: showValue(e.To), Amount: e.Amount, Outcome: string(e.Outcome),
				At: e.At, AgeSeconds: age.Seconds()})
		}
	}
	if r.Stuck > 0 {
		c.status = exitProblem
	}
	if c.json {
		return c.printJSON(r)
	}
	if len(entries) == 0 {
		fmt.Fprintf(c.out, "no moves in flight or awaiting clean-up in %s\n", *coll)
		return nil
	}
	fmt.Fprintf(c.out, "%d pending (amount %d in flight), %d records of settled moves awaiting clean-up\n", r.Pending, r.PendingAmount, r.CleanUp)
	if r.OldestPendingAge != nil {
		fmt.Fprintf(c.out, "oldest pending: %s ago\n", short(time.Duration(*r.OldestPendingAge*float64(time.Second))))
	}
	fmt.Fprintf(c.out, "\nrecords (oldest first, at most %d):\n", *limit)
	tw := c.table()
	fmt.Fprintln(tw, "MOVE\tSTAGE\tFROM\tTO\tAMOUNT\tOUTCOME\tAGE")
	for _, e := range r.Entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", e.Move, e.Stage, e.From, e.To, e.Amount, e.Outcome,
			short(time.Duration(e.AgeSeconds*float64(time.Second))))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Stuck > 0 {
		fmt.Fprintf(c.out, "\n%d moves pending longer than %s: is a queue running the relay (mongocas jobs), and Sweep?\n", r.Stuck, *stuck)
	}
	return nil
}
