// Package pgsink stores kpar's dead letters in PostgreSQL (through pgx) and
// reads them back. It is a module of its own, so that a program using kpar
// without PostgreSQL links no database driver:
//
//	go get github.com/kpar/kpar/deadletter/pgsink
//
// Sink implements deadletter.Sink; OpenSource reads a Sink's table as a
// deadletter.Source, for inspection and deadletter.Replay.
package pgsink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
)

// DefaultTable is the Sink's table unless Table says otherwise.
const DefaultTable = "kpar_dead_letters"

// TableParam is the query parameter of a postgres:// source URL that names
// the table to read (default DefaultTable); OpenSource removes it before
// connecting.
const TableParam = "kpar_table"

// Sink stores dead letters in a PostgreSQL table, one row per
// letter:
//
//	id               bigserial PRIMARY KEY  -- insertion order
//	topic            text NOT NULL
//	partition        integer NOT NULL
//	"offset"         bigint NOT NULL
//	key, value       bytea                  -- NULL for a nil key/value
//	header_keys      bytea[] NOT NULL       -- original headers, in order
//	header_values    bytea[] NOT NULL       -- NULL elements for nil values
//	record_timestamp timestamptz            -- original timestamp
//	group_id, class, message text NOT NULL
//	attempts         integer NOT NULL
//	first_failure, last_failure timestamptz -- NULL when unknown
//	stored_at        timestamptz NOT NULL DEFAULT now()
//	UNIQUE (group_id, topic, partition, "offset")
//
// Write inserts a batch in one transaction with
// INSERT ... ON CONFLICT DO NOTHING, so writing a batch again is harmless:
// the first row of a letter stays. One table holds one dead letter per
// group and original record, so several groups can share it (`kpar dlq
// --group` picks one). Times are stored with microsecond precision. Text columns cannot
// hold NUL bytes or invalid UTF-8: those are dropped or replaced in group,
// class and message (key, value and headers are bytea, kept exactly).
type Sink struct {
	pool   *pgxpool.Pool
	owned  bool   // pool was opened by Open
	ident  string // quoted table name
	insert string

	mu     sync.Mutex // guards ready and closed
	ready  bool       // the table is known to exist
	closed bool
}

var _ deadletter.Sink = (*Sink)(nil)

// Opt configures a Sink.
type Opt interface{ apply(*cfg) }

type cfg struct{ table string }

type optFunc func(*cfg)

func (o optFunc) apply(c *cfg) { o(c) }

// Table names the table, overriding the default DefaultTable. The name is
// an identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes), optionally
// qualified by a schema ("dlq.orders"); anything else makes the
// constructor fail.
func Table(name string) Opt { return optFunc(func(c *cfg) { c.table = name }) }

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// tableIdent validates name and returns it quoted.
func tableIdent(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("pgsink: invalid table name %q: at most schema.table", name)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) {
			return "", fmt.Errorf("pgsink: invalid table name %q: want [A-Za-z_][A-Za-z0-9_]*, at most 63 bytes", name)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// DefaultConnectTimeout bounds each connection attempt of the pool that
// Open opens, unless the DSN sets connect_timeout.
const DefaultConnectTimeout = 5 * time.Second

// New returns a sink writing through pool, which stays the
// caller's to close.
//
// It creates the table if missing. When the server cannot be reached, it
// still returns the sink and creates the table on the first Write instead,
// so a consumer can start while PostgreSQL is down and block on Write as in
// any other sink outage; any other error (bad table name, permissions) is
// returned. Open, unlike New, insists on reaching the server.
func New(ctx context.Context, pool *pgxpool.Pool, opts ...Opt) (*Sink, error) {
	s, err := newSink(pool, opts)
	if err != nil {
		return nil, err
	}
	if err := s.ensureTable(ctx); err != nil {
		var ce *pgconn.ConnectError
		if !errors.As(err, &ce) {
			return nil, err
		}
	}
	return s, nil
}

// Open is New on a pool it opens from dsn (a URL or key=value connection
// string, as pgxpool.ParseConfig takes); Close closes that pool.
//
// Open checks the server at once, as a sink named on a command line
// should be: it connects (each attempt bounded by the DSN's
// connect_timeout, default DefaultConnectTimeout, and all by ctx) and
// creates the table, and returns an error naming the host and what to
// check when it cannot. A wrong URL or a server that is down is then
// reported at start rather than by every dead-letter write later.
func Open(ctx context.Context, dsn string, opts ...Opt) (*Sink, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgsink: %w", err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgsink: %w", err)
	}
	s, err := newSink(pool, opts)
	if err == nil {
		err = s.ensureTable(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, explainConnect(err, cfg.ConnConfig.Host, cfg.ConnConfig.Port)
	}
	s.owned = true
	return s, nil
}

// explainConnect rewrites a failure to connect into what to check; other
// errors pass through.
func explainConnect(err error, host string, port uint16) error {
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return err
	}
	where := host
	if !strings.HasPrefix(host, "/") { // not a Unix socket directory
		where = net.JoinHostPort(host, strconv.Itoa(int(port)))
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return explained{fmt.Sprintf("pgsink: PostgreSQL at %s refused the connection: %s (SQLSTATE %s): check the user, password, database and sslmode of the URL, and the server's pg_hba.conf", where, pe.Message, pe.Code), err}
	}
	// pgconn prefixes each attempt's error with its address, which the
	// message already names.
	why := dialPrefix.ReplaceAllString(errors.Unwrap(ce).Error(), "")
	return explained{fmt.Sprintf("pgsink: cannot reach PostgreSQL at %s (%s): check that the server is running and listening there (the host and port of the URL), and that no firewall is in the way", where, why), err}
}

// explained is an error said in other words; errors.As still finds the
// original (a *pgconn.ConnectError).
type explained struct {
	msg string
	err error
}

func (e explained) Error() string { return e.msg }
func (e explained) Unwrap() error { return e.err }

var dialPrefix = regexp.MustCompile(`(?m)^\S+ \([^)]*\): `)

func newSink(pool *pgxpool.Pool, opts []Opt) (*Sink, error) {
	c := cfg{table: DefaultTable}
	for _, o := range opts {
		o.apply(&c)
	}
	ident, err := tableIdent(c.table)
	if err != nil {
		return nil, err
	}
	return &Sink{
		pool:  pool,
		ident: ident,
		insert: `INSERT INTO ` + ident + ` (topic, partition, "offset", key, value, header_keys, header_values,
	record_timestamp, group_id, class, message, attempts, first_failure, last_failure)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
ON CONFLICT DO NOTHING`,
	}, nil
}

func (s *Sink) ensureTable(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return deadletter.ErrClosed
	}
	if s.ready {
		return nil
	}
	_, err := s.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+s.ident+` (
	id bigserial PRIMARY KEY,
	topic text NOT NULL,
	partition integer NOT NULL,
	"offset" bigint NOT NULL,
	key bytea,
	value bytea,
	header_keys bytea[] NOT NULL,
	header_values bytea[] NOT NULL,
	record_timestamp timestamptz,
	group_id text NOT NULL,
	class text NOT NULL,
	message text NOT NULL,
	attempts integer NOT NULL,
	first_failure timestamptz,
	last_failure timestamptz,
	stored_at timestamptz NOT NULL DEFAULT now(),
	UNIQUE (group_id, topic, partition, "offset")
)`)
	var pe *pgconn.PgError
	// Two processes creating the table at once: one of them loses with
	// duplicate_table or unique_violation (on pg_type), and the table is there.
	if errors.As(err, &pe) && (pe.Code == "42P07" || pe.Code == "23505") {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("pgsink: creating table %s: %w", s.ident, err)
	}
	s.ready = true
	return nil
}

// Write implements Sink.
func (s *Sink) Write(ctx context.Context, letters []deadletter.Letter) error {
	if len(letters) == 0 {
		return nil
	}
	if err := s.ensureTable(ctx); err != nil {
		return err
	}
	b := new(pgx.Batch)
	for _, l := range letters {
		r := l.Record
		if r == nil {
			return errors.New("pgsink: dead letter without a record")
		}
		hk := make([][]byte, len(r.Headers))
		hv := make([][]byte, len(r.Headers))
		for i, h := range r.Headers {
			hk[i], hv[i] = []byte(h.Key), h.Value
		}
		b.Queue(s.insert, r.Topic, r.Partition, r.Offset, r.Key, r.Value, hk, hv,
			nullTime(r.Timestamp), pgText(l.Group), pgText(string(l.Class)), pgText(l.Message),
			l.Attempts, nullTime(l.FirstFailure), nullTime(l.LastFailure))
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("pgsink: inserting %d dead letters into %s: %w", len(letters), s.ident, err)
	}
	return nil
}

// Close closes the pool if Open opened it. Writes after Close return
// deadletter.ErrClosed.
func (s *Sink) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	if s.owned {
		s.pool.Close()
	}
}

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

// pgText makes s storable in a text column.
func pgText(s string) string {
	return strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "\uFFFD")
}

// OpenSource returns the Source of a Sink's table at rawURL, a
// postgres://... or postgresql://... connection URL whose query parameter
// kpar_table (TableParam) names the table, default DefaultTable. It reads
// the table in insertion order; the table's unique key means each letter
// (group and original record) appears once. It connects only when Read is
// called.
func OpenSource(rawURL string) (deadletter.Source, error) {
	return newSource(rawURL)
}

// source reads a Sink's table.
type source struct {
	dsn   string // without TableParam
	ident string
}

func newSource(rawURL string) (*source, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("pgsink: invalid source URL: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, fmt.Errorf("pgsink: source %q: want postgres:// or postgresql://", rawURL)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("pgsink: invalid source URL query: %w", err)
	}
	table := DefaultTable
	if t := q.Get(TableParam); t != "" {
		table = t
	}
	q.Del(TableParam)
	u.RawQuery = q.Encode()
	ident, err := tableIdent(table)
	if err != nil {
		return nil, err
	}
	return &source{dsn: u.String(), ident: ident}, nil
}

func (s *source) Read(ctx context.Context, fn func(deadletter.Letter) error) error {
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return fmt.Errorf("pgsink: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT topic, partition, "offset", key, value, header_keys, header_values,
	record_timestamp, group_id, class, message, attempts, first_failure, last_failure
FROM `+s.ident+` ORDER BY id`)
	if err != nil {
		return fmt.Errorf("pgsink: reading %s: %w", s.ident, err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			r          kgo.Record
			hk, hv     [][]byte
			ts, ff, lf *time.Time
			group, msg string
			class      string
			attempts   int
			key, value []byte
			topic      string
			partition  int32
			offset     int64
		)
		if err := rows.Scan(&topic, &partition, &offset, &key, &value, &hk, &hv, &ts, &group, &class, &msg, &attempts, &ff, &lf); err != nil {
			return fmt.Errorf("pgsink: reading %s: %w", s.ident, err)
		}
		r.Topic, r.Partition, r.Offset, r.Key, r.Value = topic, partition, offset, key, value
		if ts != nil {
			r.Timestamp = *ts
		}
		for i := range hk {
			var v []byte
			if i < len(hv) {
				v = hv[i]
			}
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: string(hk[i]), Value: v})
		}
		l := deadletter.Letter{Record: &r, Group: group, Class: deadletter.Class(class), Message: msg, Attempts: attempts}
		if ff != nil {
			l.FirstFailure = *ff
		}
		if lf != nil {
			l.LastFailure = *lf
		}
		if err := fn(l); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("pgsink: reading %s: %w", s.ident, err)
	}
	return nil
}
