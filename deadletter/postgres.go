package deadletter

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultTable is the PostgresSink's table unless Table says otherwise.
const DefaultTable = "kpar_dead_letters"

// TableParam is the query parameter of a postgres:// source URL that names
// the table to read (default DefaultTable); OpenSource removes it before
// connecting.
const TableParam = "kpar_table"

// PostgresSink stores dead letters in a PostgreSQL table, one row per
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
//	UNIQUE (topic, partition, "offset")
//
// Write inserts a batch in one transaction with
// INSERT ... ON CONFLICT (topic, partition, "offset") DO NOTHING, so
// writing a batch again is harmless: the first row of a record stays. One
// table therefore holds one dead letter per original record; give each
// consumer group its own table if several groups dead-letter the same
// topic. Times are stored with microsecond precision. Text columns cannot
// hold NUL bytes or invalid UTF-8: those are dropped or replaced in group,
// class and message (key, value and headers are bytea, kept exactly).
type PostgresSink struct {
	pool   *pgxpool.Pool
	owned  bool   // pool was opened by OpenPostgresSink
	ident  string // quoted table name
	insert string

	mu     sync.Mutex // guards ready and closed
	ready  bool       // the table is known to exist
	closed bool
}

var _ Sink = (*PostgresSink)(nil)

// PostgresOption configures a PostgresSink.
type PostgresOption interface{ applyPostgres(*pgCfg) }

type pgCfg struct{ table string }

type pgOpt struct{ fn func(*pgCfg) }

func (o pgOpt) applyPostgres(c *pgCfg) { o.fn(c) }

// Table names the table, overriding the default DefaultTable. The name is
// an identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes), optionally
// qualified by a schema ("dlq.orders"); anything else makes the
// constructor fail.
func Table(name string) PostgresOption {
	return pgOpt{func(c *pgCfg) { c.table = name }}
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// tableIdent validates name and returns it quoted.
func tableIdent(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return "", fmt.Errorf("deadletter: invalid table name %q: at most schema.table", name)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) {
			return "", fmt.Errorf("deadletter: invalid table name %q: want [A-Za-z_][A-Za-z0-9_]*, at most 63 bytes", name)
		}
	}
	return pgx.Identifier(parts).Sanitize(), nil
}

// NewPostgresSink returns a sink writing through pool, which stays the
// caller's to close.
//
// It creates the table if missing. When the server cannot be reached, it
// still returns the sink and creates the table on the first Write instead,
// so a consumer can start while PostgreSQL is down and block on Write as in
// any other sink outage; any other error (bad table name, permissions) is
// returned.
func NewPostgresSink(ctx context.Context, pool *pgxpool.Pool, opts ...PostgresOption) (*PostgresSink, error) {
	cfg := pgCfg{table: DefaultTable}
	for _, o := range opts {
		o.applyPostgres(&cfg)
	}
	ident, err := tableIdent(cfg.table)
	if err != nil {
		return nil, err
	}
	s := &PostgresSink{
		pool:  pool,
		ident: ident,
		insert: `INSERT INTO ` + ident + ` (topic, partition, "offset", key, value, header_keys, header_values,
	record_timestamp, group_id, class, message, attempts, first_failure, last_failure)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
ON CONFLICT (topic, partition, "offset") DO NOTHING`,
	}
	if err := s.ensureTable(ctx); err != nil {
		var ce *pgconn.ConnectError
		if !errors.As(err, &ce) {
			return nil, err
		}
	}
	return s, nil
}

// OpenPostgresSink is NewPostgresSink on a pool it opens from dsn (a URL or
// key=value connection string, as pgxpool.ParseConfig takes); Close closes
// that pool.
func OpenPostgresSink(ctx context.Context, dsn string, opts ...PostgresOption) (*PostgresSink, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("deadletter: %w", err)
	}
	s, err := NewPostgresSink(ctx, pool, opts...)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

func (s *PostgresSink) ensureTable(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
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
	UNIQUE (topic, partition, "offset")
)`)
	var pe *pgconn.PgError
	// Two processes creating the table at once: one of them loses with
	// duplicate_table or unique_violation (on pg_type), and the table is there.
	if errors.As(err, &pe) && (pe.Code == "42P07" || pe.Code == "23505") {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("deadletter: creating table %s: %w", s.ident, err)
	}
	s.ready = true
	return nil
}

// Write implements Sink.
func (s *PostgresSink) Write(ctx context.Context, letters []DeadLetter) error {
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
			return errors.New("deadletter: dead letter without a record")
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
		return fmt.Errorf("deadletter: inserting %d dead letters into %s: %w", len(letters), s.ident, err)
	}
	return nil
}

// Close closes the pool if OpenPostgresSink opened it. Writes after Close
// return ErrClosed.
func (s *PostgresSink) Close() {
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

// pgSource reads a PostgresSink table.
type pgSource struct {
	dsn   string // without TableParam
	ident string
}

func newPGSource(rawURL string) (*pgSource, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("deadletter: invalid source URL: %w", err)
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("deadletter: invalid source URL query: %w", err)
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
	return &pgSource{dsn: u.String(), ident: ident}, nil
}

func (s *pgSource) Read(ctx context.Context, fn func(DeadLetter) error) error {
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return fmt.Errorf("deadletter: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(ctx, `SELECT topic, partition, "offset", key, value, header_keys, header_values,
	record_timestamp, group_id, class, message, attempts, first_failure, last_failure
FROM `+s.ident+` ORDER BY id`)
	if err != nil {
		return fmt.Errorf("deadletter: reading %s: %w", s.ident, err)
	}
	defer rows.Close()
	fn = dedupe(fn)
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
			return fmt.Errorf("deadletter: reading %s: %w", s.ident, err)
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
		l := DeadLetter{Record: &r, Group: group, Class: Class(class), Message: msg, Attempts: attempts}
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
		return fmt.Errorf("deadletter: reading %s: %w", s.ident, err)
	}
	return nil
}
