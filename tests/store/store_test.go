package store_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver"
	"go.mongodb.org/mongo-driver/v2/x/mongo/driver/topology"

	"github.com/mongocas/mongocas/mongotest"
	"github.com/mongocas/mongocas/store"
)

func TestMain(m *testing.M) { mongotest.Main(m, mongotest.CheckLeaks()) }

func TestConnectAppliesProductionDefaults(t *testing.T) {
	co := store.ClientOptions("mongodb://localhost:27017", nil)
	require.Equal(t, "mongocas", *co.AppName)
	require.Equal(t, writeconcern.Majority().W, co.WriteConcern.W)
	require.True(t, *co.RetryWrites)
	require.True(t, *co.RetryReads)
	require.Equal(t, 10*time.Second, *co.ServerSelectionTimeout)
	require.Equal(t, uint64(100), *co.MaxPoolSize)

	// The URI overrides the defaults, and ClientOptions override both.
	co = store.ClientOptions("mongodb://localhost:27017/?appName=fromuri&retryWrites=false", nil)
	require.Equal(t, "fromuri", *co.AppName)
	require.False(t, *co.RetryWrites)
}

func TestConnectToServer(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	s, err := store.Connect(ctx, db.Server.URI, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close(ctx)) }()

	coll := s.Database(db.Name()).Collection("c")
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)
	caps, err := s.Server().Capabilities(ctx, s.Database(db.Name()))
	require.NoError(t, err)
	require.Equal(t, db.Caps(), caps)
	e, err := s.Server().Clock().Now(ctx)
	require.NoError(t, err)
	require.False(t, e.Time.IsZero())
}

func TestNewDoesNotOwnTheClient(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	s := store.New(db.Client())
	require.NoError(t, s.Close(ctx))
	require.NoError(t, db.Client().Ping(ctx, nil), "Close of a Store made by New must leave the caller's client connected")
}

func TestConnectMalformedURI(t *testing.T) {
	_, err := store.Connect(context.Background(), "mongodb://user:s3cret@host:notaport/?w=1", nil)
	require.ErrorIs(t, err, store.ErrConnect)
	var ce *store.ConnectError
	require.ErrorAs(t, err, &ce)
	require.NotContains(t, err.Error(), "s3cret", "credentials must be redacted")
	require.Contains(t, err.Error(), "mongodb://user:xxxxx@host:notaport/?w=1")

	// Neither the URI in the message nor the driver's reason shows a secret
	// of a URI that does not parse.
	for _, tc := range []struct{ uri, secret string }{
		{"mongodb://admin:s3cr/et@h/app", "s3cr/et"},
		{"mongodb://admin:p@ssw0rd@h/app", "p@ssw0rd"},
		{"mongodb://admin:pa:ssw0rd@h/app", "pa:ssw0rd"},
		{"mongodb://admin:hunter2@h:notaport/app", "hunter2"},
		{"mongodb://h/?connectTimeoutMS=soon&tlsCertificateKeyFilePassword=hunter2", "hunter2"},
		{"mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:tok3n&connectTimeoutMS=soon", "tok3n"},
	} {
		_, err := store.Connect(context.Background(), tc.uri, &store.Options{ServerSelectionTimeout: 200 * time.Millisecond})
		require.ErrorIs(t, err, store.ErrConnect, tc.uri)
		require.NotContains(t, err.Error(), tc.secret, tc.uri)
	}

	_, err = store.Connect(context.Background(), "  ", nil)
	require.ErrorIs(t, err, store.ErrConnect)
	_, err = store.Connect(context.Background(), "http://example", nil)
	require.ErrorIs(t, err, store.ErrConnect)
}

func TestConnectUnreachableFailsInBoundedTime(t *testing.T) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now

	uri := fmt.Sprintf("mongodb://app:hunter2@%s/?connectTimeoutMS=500", addr)
	began := time.Now()
	_, err = store.Connect(context.Background(), uri, &store.Options{ServerSelectionTimeout: 700 * time.Millisecond})
	took := time.Since(began)
	require.ErrorIs(t, err, store.ErrConnect)
	require.Contains(t, err.Error(), addr)
	require.NotContains(t, err.Error(), "hunter2")
	require.Less(t, took, 10*time.Second, "Connect must give up within its server selection timeout")
}

func TestRedactURI(t *testing.T) {
	require.Equal(t, "mongodb://u:xxxxx@h:1/db", store.RedactURI("mongodb://u:pw@h:1/db"))
	require.Equal(t, "mongodb://h:1/", store.RedactURI("mongodb://h:1/"))
	require.Equal(t, "mongodb://u:xxxxx@h", store.RedactURI("mongodb://u:p%w@h"))
	require.Equal(t, "mongodb://u:xxxxx@h1:1,h2:2/db?replicaSet=rs", store.RedactURI("mongodb://u:p@ss@h1:1,h2:2/db?replicaSet=rs"))
	require.Equal(t, "mongodb+srv://u@cluster.example/", store.RedactURI("mongodb+srv://u@cluster.example/"))
	require.Equal(t, "h:1", store.RedactURI("h:1"))

	for _, tc := range []struct{ uri, want string }{
		// Unescaped '/', '?', '@' in the password (the URIs that fail to
		// parse and get printed).
		{"mongodb://admin:s3cr/et@db:27017/app", "mongodb://admin:xxxxx@db:27017/app"},
		{"mongodb://admin:pa?ss@db:27017/app", "mongodb://admin:xxxxx@db:27017/app"},
		{"mongodb://admin:a@b/c@db:27017/app", "mongodb://admin:xxxxx@db:27017/app"},
		{"mongodb://admin:a/b?c=d@db/app?w=1", "mongodb://admin:xxxxx@db/app?w=1"},
		{"admin:s3cr/et@db", "admin:xxxxx@db"},
		// An '@' in an option value of a URI the driver reads keeps the hosts.
		{"mongodb://u:pw@h/db?appName=svc@prod", "mongodb://u:xxxxx@h/db?appName=svc@prod"},
		{"mongodb://h/db?appName=svc@prod", "mongodb://h/db?appName=svc@prod"},
		// Secret options, in any case, escaped or not; others are kept.
		{"mongodb://h/?tls=true&tlsCertificateKeyFilePassword=hunter2&w=1", "mongodb://h/?tls=true&tlsCertificateKeyFilePassword=xxxxx&w=1"},
		{"mongodb://h/?SSLCLIENTCERTIFICATEKEYPASSWORD=hunter2", "mongodb://h/?SSLCLIENTCERTIFICATEKEYPASSWORD=xxxxx"},
		{"mongodb://h/?tlsCertificateKeyFile%50assword=hunter2", "mongodb://h/?tlsCertificateKeyFile%50assword=xxxxx"},
		{"mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:tok3n;w=1", "mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=xxxxx;w=1"},
		{"mongodb://h/?clientSecret=s&apiToken=t&key-password=k", "mongodb://h/?clientSecret=xxxxx&apiToken=xxxxx&key-password=xxxxx"},
		{"mongodb://u:p@h/?authMechanismProperties=AWS_SESSION_TOKEN:a@b", "mongodb://u:xxxxx@h/?authMechanismProperties=xxxxx"},
		// Both searches run on the original: neither hides part of a secret
		// from the other.
		{"mongodb://h/?a:b&tlsCertificateKeyFilePassword=se@cret", "mongodb://h/?a:xxxxx"},
		{"mongodb://u:x?token=ab@h/db", "mongodb://u:xxxxx"},
		{"mongodb://u:@h/?a=b@h2/db", "mongodb://u:xxxxx@h2/db"},
	} {
		require.Equal(t, tc.want, store.RedactURI(tc.uri), tc.uri)
	}
}

// For any URI with a password (four characters or more, found nowhere else in
// the URI), the redacted form does not contain it, whatever the password,
// hosts and the rest hold ('/', '?', '@', ':' included). The user name is kept
// free of ':', '/', '?' and '@', which make it a different URI.
func FuzzRedactURIHidesPassword(f *testing.F) {
	f.Add("admin", "s3cr/et", "db.example.com:27017", "/app", false)
	f.Add("admin", "pa?ss", "db", "/app?w=1", true)
	f.Add("u", "p@ss@h", "h1:1,h2:2", "/db?appName=a@b", false)
	f.Add("u", "@ab/", "h", "/db", false)
	f.Add("u", "x?token=ab", "host", "/db?replicaSet=rs&tlsCertificateKeyFilePassword=pw", false)
	f.Add("u", "p@h/?x=yyyy", "host", "/db", false)
	f.Fuzz(func(t *testing.T, user, password, hosts, tail string, srv bool) {
		if strings.ContainsAny(user, ":/?@") {
			return
		}
		scheme := "mongodb://"
		if srv {
			scheme = "mongodb+srv://"
		}
		uri := scheme + user + ":" + password + "@" + hosts + tail
		if len(password) < 4 || strings.Contains(password, "\x00") || overlapping(uri, password) != 1 {
			return
		}
		got := store.RedactURI(uri)
		if strings.Contains(strings.ReplaceAll(got, "xxxxx", "\x00"), password) {
			t.Fatalf("RedactURI(%q) = %q shows the password %q", uri, got, password)
		}
	})
}

// For any URI with a secret option, the redacted form does not contain the
// option's value (four characters or more, found nowhere else in the URI, with
// no '&' or ';', which end a value).
func FuzzRedactURIHidesSecretOptions(f *testing.F) {
	f.Add("h", "w=1", "tlsCertificateKeyFilePassword", "hunter2")
	f.Add("u:p@h", "appName=a@b", "authMechanismProperties", "AWS_SESSION_TOKEN:tok3n")
	f.Add("h/x", "a:b", "SECRET", "se@cret")
	f.Fuzz(func(t *testing.T, authority, before, name, value string) {
		lower := strings.ToLower(name)
		if !strings.Contains(lower, "pass") && !strings.Contains(lower, "token") && !strings.Contains(lower, "secret") {
			return
		}
		if strings.ContainsAny(name, "&;=?") {
			return
		}
		uri := "mongodb://" + authority + "/?" + before + "&" + name + "=" + value
		if len(value) < 4 || strings.ContainsAny(value, "&;\x00") || overlapping(uri, value) != 1 {
			return
		}
		got := store.RedactURI(uri)
		if strings.Contains(strings.ReplaceAll(got, "xxxxx", "\x00"), value) {
			t.Fatalf("RedactURI(%q) = %q shows %s's value %q", uri, got, name, value)
		}
	})
}

// overlapping counts the occurrences of sub in s, overlapping ones included.
func overlapping(s, sub string) int {
	n := 0
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			n++
		}
	}
	return n
}

func TestErrorClassificationOnServer(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	coll := db.Collection("c")
	_, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	require.NoError(t, err)
	_, err = coll.InsertOne(ctx, bson.D{{Key: "_id", Value: 1}})
	wrapped := fmt.Errorf("saving order: %w", err)
	require.True(t, store.IsDuplicateKey(wrapped))
	require.False(t, store.IsTransient(wrapped))
	require.False(t, store.IsAmbiguous(wrapped))

	f := db.Faulty(t, nil)
	f.DropNextReply(mongotest.Writes("c"))
	_, err = f.Collection("c").InsertOne(ctx, bson.D{{Key: "_id", Value: 2}})
	wrapped = fmt.Errorf("op: %w", err)
	require.True(t, store.IsNetwork(wrapped), "got %v", err)
	require.True(t, store.IsTransient(wrapped))
	require.True(t, store.IsAmbiguous(wrapped))
	require.False(t, store.IsDuplicateKey(wrapped))

	// Reconnect first (the dropped reply closed the connection and made the
	// driver forget the server), so the next find is really sent and it is
	// its reply that times out.
	require.NoError(t, f.Client.Ping(ctx, nil))
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	stop := f.DelayReplies(300*time.Millisecond, nil)
	defer stop()
	err = f.Collection("c").FindOne(short, bson.D{}).Err()
	require.True(t, store.IsTimeout(err), "got %v", err)
	require.True(t, store.IsAmbiguous(err))
}

func TestErrorClassificationByLabel(t *testing.T) {
	labelled := func(labels ...string) error {
		return fmt.Errorf("wrapped: %w", mongo.CommandError{Code: 1, Labels: labels})
	}
	require.True(t, store.IsTransient(labelled(store.LabelRetryableWrite)))
	require.True(t, store.IsTransient(labelled(store.LabelTransientTransaction)))
	require.True(t, store.IsAmbiguous(labelled(store.LabelUnknownCommitResult)))
	require.True(t, store.HasLabel(errors.Join(errors.New("x"), labelled("Custom")), "Custom"))
	require.False(t, store.IsTransient(labelled()))
	require.True(t, store.IsWriteConflict(mongo.CommandError{Code: 112, Name: "WriteConflict"}))
	require.True(t, store.IsTransient(mongo.CommandError{Code: 112}))
	require.False(t, store.IsTransient(context.Canceled))
	require.False(t, store.IsTransient(fmt.Errorf("x: %w", context.Canceled)))
	require.False(t, store.IsTransient(nil))
	require.False(t, store.IsAmbiguous(nil))
	// The driver gave up before sending: nothing can have been applied.
	require.False(t, store.IsAmbiguous(fmt.Errorf("op: %w", topology.ServerSelectionError{Wrapped: context.DeadlineExceeded})))
	require.False(t, store.IsAmbiguous(fmt.Errorf("op: %w", driver.ErrDeadlineWouldBeExceeded)))
	require.True(t, store.IsAmbiguous(fmt.Errorf("op: %w", context.DeadlineExceeded)), "a deadline after sending is")
	// Text is never matched: an error that merely says "network" is not one.
	require.False(t, store.IsNetwork(errors.New("network error: connection reset")))
}

func TestProbeOnServer(t *testing.T) {
	db := mongotest.New(t)
	ctx := context.Background()
	caps, err := store.Probe(ctx, db.Database)
	require.NoError(t, err)
	require.Equal(t, db.Caps(), caps)
	requireNoProbeCollection(t, db)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = store.Probe(cancelled, db.Database)
	require.ErrorIs(t, err, context.Canceled)
}
