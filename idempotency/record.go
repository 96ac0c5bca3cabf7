package idempotency

import (
	"net/http"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// record is a key's document, without the fields Keys only write
// (DESIGN.md, "The record"). Epoch is that of the last claim that ran.
type record struct {
	ID       string        `bson:"_id"`
	RID      bson.ObjectID `bson:"rid"`
	FP       []byte        `bson:"fp"`
	Epoch    int64         `bson:"epoch"`
	Attempts int           `bson:"attempts"`
	Points   []point       `bson:"points"`
	Result   *storedResult `bson:"result"`
}

// point is a checkpoint ("c:" + name) or the start of a step ("b:" + name),
// recorded by the claim of epoch E with the write id W (a step's partner key).
type point struct {
	K     string        `bson:"k"`
	Name  string        `bson:"n"`
	Data  []byte        `bson:"d,omitempty"`
	Epoch int64         `bson:"e"`
	W     bson.ObjectID `bson:"w"`
}

// storedResult is a final result as recorded.
type storedResult struct {
	Status int           `bson:"status"`
	Header []headerField `bson:"header,omitempty"`
	Body   []byte        `bson:"body,omitempty"`
	Epoch  int64         `bson:"epoch"`
	At     time.Time     `bson:"at"`
}

// headerField is one header field; names are values, never BSON field names.
type headerField struct {
	Name   string   `bson:"n"`
	Values []string `bson:"v"`
}

func headerFields(h http.Header) []headerField {
	if len(h) == 0 {
		return nil
	}
	out := make([]headerField, 0, len(h))
	for name, values := range h {
		out = append(out, headerField{Name: name, Values: values})
	}
	return out
}

func (s *storedResult) replay() Result {
	r := Result{Status: s.Status, Body: s.Body, Replayed: true, Epoch: s.Epoch}
	if len(s.Header) > 0 {
		r.Header = make(http.Header, len(s.Header))
	}
	for _, f := range s.Header {
		r.Header[f.Name] = f.Values
	}
	return r
}
