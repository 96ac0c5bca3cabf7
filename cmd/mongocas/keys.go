package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/mongocas/mongocas/idempotency"
	"github.com/mongocas/mongocas/store"
)

// keyRecord is idempotency's record, read raw (idempotency/DESIGN.md).
type keyRecord struct {
	Key       string      `bson:"key"`
	Scope     string      `bson:"scope"`
	FP        []byte      `bson:"fp"`
	CreatedAt time.Time   `bson:"createdAt"`
	ExpireAt  time.Time   `bson:"expireAt"`
	Lease     leaseRecord `bson:"_lease"`
	Attempts  int64       `bson:"attempts"`
	Points    []bson.Raw  `bson:"points"`
	Result    *struct {
		Status int `bson:"status"`
		Header []struct {
			N string   `bson:"n"`
			V []string `bson:"v"`
		} `bson:"header"`
		Body  []byte    `bson:"body"`
		Epoch int64     `bson:"epoch"`
		At    time.Time `bson:"at"`
	} `bson:"result"`
}

type keyReport struct {
	Key         string            `json:"key"`
	Scope       string            `json:"scope,omitempty"`
	State       string            `json:"state"`
	Explain     string            `json:"explain"`
	Fingerprint string            `json:"fingerprintSha256"`
	Holder      string            `json:"holder,omitempty"`
	Epoch       int64             `json:"epoch,omitempty"`
	Attempts    int64             `json:"attempts"`
	Checkpoints int               `json:"checkpoints"`
	CreatedAt   time.Time         `json:"createdAt"`
	AgeSeconds  float64           `json:"ageSeconds"`
	ExpireAt    time.Time         `json:"expireAt"`
	ExpiresIn   float64           `json:"expiresInSeconds"`
	Status      int               `json:"status,omitempty"`
	Header      map[string]string `json:"header,omitempty"`
	Body        string            `json:"body,omitempty"`
	BodyBytes   int               `json:"bodyBytes,omitempty"`
	CompletedAt time.Time         `json:"completedAt,omitzero"`
}

func (c *cli) keys(ctx context.Context, args []string) error {
	fs := c.flags("keys")
	coll := fs.String("keys", "", "the idempotency keys collection (the one given to idempotency.New)")
	scope := fs.String("scope", "", "the key's scope (idempotency.InScope)")
	pos, err := c.parse(fs, args)
	if err != nil {
		return err
	}
	if *coll == "" || len(pos) != 1 {
		return usageErr("want: mongocas keys --keys COLLECTION KEY [--scope S]")
	}
	key := pos[0]
	if err := idempotency.CheckKey(key); err != nil {
		return usageErr("%v", err)
	}
	k, ctx, done, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	id := key
	if *scope != "" {
		id = *scope + "\n" + key
	}
	var rec keyRecord
	err = k.db.Collection(*coll).FindOne(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$eq", Value: id}}}}).Decode(&rec)
	if errors.Is(err, mongo.ErrNoDocuments) {
		return &cliError{err: fmt.Errorf("no record of key %q (scope %q) in %s", key, *scope, *coll),
			fix: "the key was never used, or its record was deleted after its retention; check --keys and --scope", code: exitProblem}
	}
	if err != nil {
		return fail(fmt.Errorf("read the record of key %q: %w", key, err), "check the collection name and the user's read access")
	}
	est, err := store.NewServerClock(store.HelloSampler(k.st.Client()), nil).Now(ctx)
	if err != nil {
		return fail(fmt.Errorf("read the server's clock: %w", err), "")
	}
	r := keyReport{Key: key, Scope: *scope, Fingerprint: hex.EncodeToString(rec.FP), Attempts: rec.Attempts,
		Checkpoints: len(rec.Points), CreatedAt: rec.CreatedAt, AgeSeconds: est.Time.Sub(rec.CreatedAt).Seconds(),
		ExpireAt: rec.ExpireAt, ExpiresIn: rec.ExpireAt.Sub(est.Time).Seconds(), Holder: rec.Lease.Owner, Epoch: rec.Lease.Epoch}
	live := rec.Lease.Owner != "" && rec.Lease.ExpiresAt.After(est.Earliest())
	switch {
	case rec.Result != nil:
		r.State = "completed"
		r.Explain = "a retry with the same fingerprint gets the stored answer; another fingerprint gets 422"
		r.Status, r.CompletedAt, r.BodyBytes = rec.Result.Status, rec.Result.At, len(rec.Result.Body)
		r.Header = map[string]string{}
		for _, h := range rec.Result.Header {
			r.Header[h.N] = strings.Join(h.V, ", ")
		}
		body := rec.Result.Body
		if utf8.Valid(body) {
			if len(body) > 500 {
				body = append(body[:497:497], "..."...)
			}
			r.Body = string(body)
		} else {
			r.Body = fmt.Sprintf("(%d bytes of binary)", len(body))
		}
	case live:
		r.State = "running"
		r.Explain = fmt.Sprintf("held by %s, epoch %d, for %s more unless renewed: a retry now gets 409", rec.Lease.Owner,
			rec.Lease.Epoch, short(rec.Lease.ExpiresAt.Sub(est.Time)))
	case rec.Attempts > 0:
		r.State = "failed"
		r.Explain = fmt.Sprintf("ran %d times without storing an answer (an error, or its process died): "+
			"the next request runs it again, from its %d checkpoints", rec.Attempts, len(rec.Points))
	default:
		r.State = "opened"
		r.Explain = "recorded, never run: the next request with the key runs it"
	}
	if c.json {
		return c.printJSON(r)
	}
	tw := c.table()
	fmt.Fprintf(tw, "key\t%s\n", key)
	if *scope != "" {
		fmt.Fprintf(tw, "scope\t%s\n", *scope)
	}
	fmt.Fprintf(tw, "state\t%s\t%s\n", r.State, r.Explain)
	fmt.Fprintf(tw, "fingerprint\tsha256:%s\n", r.Fingerprint)
	fmt.Fprintf(tw, "age\t%s\tcreated %s\n", short(time.Duration(r.AgeSeconds*float64(time.Second))), r.CreatedAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "expires\tin %s\tat %s (retention; deleted by the TTL index or Keys.Sweep after)\n",
		short(time.Duration(r.ExpiresIn*float64(time.Second))), r.ExpireAt.UTC().Format(time.RFC3339))
	fmt.Fprintf(tw, "attempts\t%d\t%d checkpoints\n", r.Attempts, r.Checkpoints)
	if rec.Result != nil {
		fmt.Fprintf(tw, "answer\tstatus %d\tstored %s\n", r.Status, r.CompletedAt.UTC().Format(time.RFC3339))
		for _, h := range rec.Result.Header {
			fmt.Fprintf(tw, "  header\t%s: %s\n", h.N, strings.Join(h.V, ", "))
		}
		fmt.Fprintf(tw, "  body\t%s\n", r.Body)
	}
	return tw.Flush()
}
