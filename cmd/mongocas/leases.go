package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/mongocas/mongocas/store"
)

// leaseRecord is lease's record, read raw (lease/DESIGN.md).
type leaseRecord struct {
	Owner     string    `bson:"owner"`
	Epoch     int64     `bson:"epoch"`
	ExpiresAt time.Time `bson:"expiresAt"`
	Claim     any       `bson:"claim"`
	Renewal   any       `bson:"renewal"`
}

type leaseRow struct {
	Kind       string    `json:"kind"` // named or document
	Collection string    `json:"collection"`
	ID         string    `json:"id"`
	Holder     string    `json:"holder"`
	Epoch      int64     `json:"epoch"`
	ExpiresAt  time.Time `json:"expiresAt,omitzero"`
	LeftMS     float64   `json:"timeLeftMs"` // on the server's clock, as estimated
	BoundMS    float64   `json:"clockBoundMs"`
	State      string    `json:"state"` // held, expired, expiring, free
}

func (c *cli) leases(ctx context.Context, args []string) error {
	fs := c.flags("leases")
	lockColl := fs.String("leases", "", "a named-lease lock collection")
	docColl := fs.String("coll", "", "a collection of documents leased with lease.New")
	field := fs.String("field", "_lease", "the lease field (lease.Options.Field)")
	force := fs.Bool("force", false, "release: release a lease whose holder is known dead")
	owner := fs.String("owner", "", "release: the dead holder's owner string, as listed")
	epoch := fs.Int64("epoch", 0, "release: the dead holder's epoch, as listed")
	dry := fs.Bool("dry-run", false, "release: show what would change, change nothing")
	yes := fs.Bool("yes", false, "release: do not ask")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 && *lockColl == "" && *docColl == "" {
		return usageErr("name the leases: --leases LOCKS (named leases) and/or --coll C (document leases)")
	}
	if len(pos) > 0 && (*lockColl == "") == (*docColl == "") {
		return usageErr("leases release: name exactly one collection: --leases LOCKS NAME or --coll C ID")
	}
	k, ctx, done, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	clock := store.NewServerClock(store.HelloSampler(k.st.Client()), nil)
	if len(pos) > 0 {
		if pos[0] != "release" || len(pos) != 2 {
			return usageErr("leases: want: leases release --force (--leases C NAME | --coll C ID) --owner O --epoch E")
		}
		if !*force {
			return usageErr("leases release takes --force: it is for a holder known to be dead (a crashed process); " +
				"a live holder releases its own lease")
		}
		if *owner == "" || *epoch == 0 {
			return usageErr("leases release needs --owner and --epoch of the dead holder, as mongocas leases lists them")
		}
		id, err := parseID(pos[1])
		if err != nil {
			return err
		}
		coll, named := *docColl, false
		if *lockColl != "" {
			coll, named = *lockColl, true
		}
		return c.forceRelease(ctx, k.db.Collection(coll), named, *field, id, pos[1], *owner, *epoch, clock, *dry, *yes)
	}

	est, err := clock.Now(ctx)
	if err != nil {
		return fail(fmt.Errorf("read the server's clock (hello): %w", err), "check that the server answers hello")
	}
	rows := []leaseRow{}
	for _, src := range []struct{ coll, kind string }{{*lockColl, "named"}, {*docColl, "document"}} {
		if src.coll == "" {
			continue
		}
		filter := bson.D{}
		if src.kind == "document" {
			filter = bson.D{{Key: *field + ".epoch", Value: bson.D{{Key: "$exists", Value: true}}}}
		}
		cur, err := k.db.Collection(src.coll).Find(ctx, filter,
			options.Find().SetProjection(bson.D{{Key: *field, Value: 1}}).SetSort(bson.D{{Key: "_id", Value: 1}}).SetLimit(1000))
		if err != nil {
			return fail(fmt.Errorf("read the leases of %s: %w", src.coll, err), "check the collection name and the user's read access")
		}
		var docs []bson.Raw
		if err := cur.All(ctx, &docs); err != nil {
			return fail(fmt.Errorf("read the leases of %s: %w", src.coll, err), "")
		}
		for _, d := range docs {
			var rec leaseRecord
			if v, err := d.LookupErr(*field); err == nil {
				_ = v.Unmarshal(&rec)
			}
			row := leaseRow{Kind: src.kind, Collection: src.coll, ID: showValue(d.Lookup("_id")), Holder: rec.Owner,
				Epoch: rec.Epoch, ExpiresAt: rec.ExpiresAt, BoundMS: ms(est.Bound)}
			left := rec.ExpiresAt.Sub(est.Time)
			row.LeftMS = ms(left)
			switch {
			case rec.Owner == "":
				row.State, row.LeftMS = "free", 0
			case left > est.Bound:
				row.State = "held"
			case left < -est.Bound:
				row.State = "expired"
			default:
				row.State = "expiring"
			}
			rows = append(rows, row)
		}
	}
	if c.json {
		return c.printJSON(map[string]any{"serverTime": est.Time, "clockBoundMs": ms(est.Bound), "leases": rows})
	}
	if len(rows) == 0 {
		fmt.Fprintln(c.out, "no leases")
		return nil
	}
	tw := c.table()
	fmt.Fprintln(tw, "KIND\tCOLLECTION\tID\tHOLDER\tEPOCH\tSTATE\tTIME LEFT")
	for _, r := range rows {
		left := ""
		if r.State != "free" {
			left = short(time.Duration(r.LeftMS*float64(time.Millisecond))) + " ±" + short(est.Bound)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.Kind, r.Collection, r.ID, r.Holder, r.Epoch, r.State, left)
	}
	_ = tw.Flush()
	fmt.Fprintln(c.out, "time left is on the server's clock, as estimated from this host")
	return nil
}

// forceRelease releases the lease of a holder the user knows is dead, fenced
// on the owner and epoch the user names and on the record as read (its claim,
// expiry and renewal): if the holder renewed, or anyone claimed it since,
// the update matches nothing.
func (c *cli) forceRelease(ctx context.Context, coll *mongo.Collection, named bool, field string, id any, idText,
	owner string, epoch int64, clock *store.ServerClock, dry, yes bool) error {
	var doc bson.Raw
	err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$eq", Value: id}}}}).Decode(&doc)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return &cliError{err: fmt.Errorf("no lease %s in %s", idText, coll.Name()), fix: "check the name or id and the collection; nothing was changed", code: exitProblem}
	}
	if err != nil {
		return fail(fmt.Errorf("read the lease %s: %w", idText, err), "")
	}
	var rec leaseRecord
	raw, ok := doc.Lookup(field).DocumentOK()
	if ok {
		_ = bson.Unmarshal(raw, &rec)
	}
	res := map[string]any{"id": idText, "collection": coll.Name(), "owner": owner, "epoch": epoch, "dryRun": dry}
	say := func(status int, msg string) error {
		c.status = status
		res["result"] = msg
		if c.json {
			return c.printJSON(res)
		}
		fmt.Fprintln(c.out, msg)
		return nil
	}
	if rec.Owner == "" {
		return say(exitOK, fmt.Sprintf("nothing to release: lease %s is free (epoch %d); nothing was changed", idText, rec.Epoch))
	}
	if rec.Owner != owner || rec.Epoch != epoch {
		return say(exitProblem, fmt.Sprintf("nothing changed: lease %s is held by %q epoch %d, not by %q epoch %d "+
			"(another owner took it, or the ids are wrong)", idText, rec.Owner, rec.Epoch, owner, epoch))
	}
	est, err := clock.Now(ctx)
	if err != nil {
		return fail(fmt.Errorf("read the server's clock: %w", err), "")
	}
	left := rec.ExpiresAt.Sub(est.Time)
	desc := fmt.Sprintf("lease %s in %s held by %q epoch %d, %s left", idText, coll.Name(), owner, epoch, short(left))
	if dry {
		return say(exitOK, "dry run: would release "+desc+"; nothing was changed")
	}
	if !yes && !c.confirm("release "+desc+"? Its holder must be dead:") {
		return notConfirmed()
	}
	p := field + "."
	filter := bson.D{
		{Key: "_id", Value: bson.D{{Key: "$eq", Value: id}}},
		{Key: p + "owner", Value: bson.D{{Key: "$eq", Value: rec.Owner}}},
		{Key: p + "epoch", Value: rec.Epoch},
		{Key: p + "expiresAt", Value: rec.ExpiresAt},
	}
	for _, f := range []struct {
		name string
		v    any
	}{{"claim", rec.Claim}, {"renewal", rec.Renewal}} {
		if f.v == nil {
			filter = append(filter, bson.E{Key: p + f.name, Value: bson.D{{Key: "$exists", Value: false}}})
		} else {
			filter = append(filter, bson.E{Key: p + f.name, Value: bson.D{{Key: "$eq", Value: f.v}}})
		}
	}
	// As lease's own Release: the epoch stays, so the next claim gets a
	// larger one; a named lease keeps an expiry (now) for the clean-up.
	update := bson.D{{Key: "$unset", Value: bson.D{{Key: p + "owner", Value: ""}, {Key: p + "claim", Value: ""}, {Key: p + "expiresAt", Value: ""}}}}
	if named {
		update = bson.D{
			{Key: "$unset", Value: bson.D{{Key: p + "owner", Value: ""}, {Key: p + "claim", Value: ""}}},
			{Key: "$set", Value: bson.D{{Key: p + "expiresAt", Value: est.Time}}},
		}
	}
	ur, err := coll.UpdateOne(ctx, filter, update)
	if err != nil {
		return fail(fmt.Errorf("release %s: %w", desc, err), "run mongocas leases to see the lease as it is now, then try again")
	}
	if ur.MatchedCount == 0 {
		return say(exitProblem, "nothing changed: the holder renewed the lease, or another owner took it, "+
			"since it was read; it is alive: run mongocas leases again")
	}
	return say(exitOK, "released "+desc+": the next claim gets a larger epoch, and the old holder's fenced writes fail")
}
