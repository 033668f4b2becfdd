package pgsink

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"

	"github.com/kpar/kpar/internal/testkit"
)

func testCtx(t *testing.T) context.Context { return testkit.Context(t, time.Minute) }

func postgresDSN(t *testing.T) string { return testkit.PostgresDSN(t) }

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// uniqueTable names a table for this test only and drops it afterwards.
func uniqueTable(t *testing.T, dsn string) string {
	t.Helper()
	b := make([]byte, 4)
	rand.Read(b)
	name := nonIdent.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	name = "t_" + strings.Trim(name, "_") + "_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		conn.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	return name
}

// withTable is dsn with TableParam naming table.
func withTable(dsn, table string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		panic(err)
	}
	q := u.Query()
	q.Set(TableParam, table)
	u.RawQuery = q.Encode()
	return u.String()
}

func closedPort(t *testing.T) string { return testkit.ClosedPort(t) }

// lazyPool is a pool on dsn that connects only when used, closed after
// the test.
func lazyPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// sampleLetters exercise the columns' corners: nil versus empty key and
// value, binary bytes in bytea, duplicate and nil header values, NUL in
// a text column, unknown failure times.
func sampleLetters() []deadletter.Letter {
	at := time.Date(2024, 5, 6, 7, 8, 9, 123e6, time.UTC)
	h := func(k string, v []byte) kgo.RecordHeader { return kgo.RecordHeader{Key: k, Value: v} }
	return []deadletter.Letter{
		{Record: &kgo.Record{Topic: "orders", Partition: 0, Offset: 10, Key: []byte("k0"), Value: []byte("v0"),
			Headers: []kgo.RecordHeader{h("trace", []byte("abc"))}, Timestamp: at},
			Group: "billing", Class: deadletter.ClassExhausted, Message: "declined", Attempts: 5, FirstFailure: at, LastFailure: at.Add(time.Second)},
		{Record: &kgo.Record{Topic: "orders", Partition: 0, Offset: 11, Timestamp: at},
			Group: "billing", Class: deadletter.ClassPermanent, Message: "bad payload", Attempts: 1, LastFailure: at},
		{Record: &kgo.Record{Topic: "orders", Partition: 3, Offset: 7, Key: []byte{}, Value: []byte{0, 0xff, '\n'},
			Headers: []kgo.RecordHeader{h("dup", []byte("1")), h("dup", []byte("2")), h("nil", nil), h("empty", []byte{})}, Timestamp: at},
			Group: "billing", Class: deadletter.ClassPanic, Message: "panic: boom", Attempts: 1},
	}
}
