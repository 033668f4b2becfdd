package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/deadletter/pgsink"
)

// dlqConnectTimeout bounds how long the dlq commands wait for Kafka brokers
// to answer before giving up.
const dlqConnectTimeout = 30 * time.Second

const dlqSourceHelp = "`URL` of the dead letters: kafka://HOST:PORT[,...]/TOPIC[,...], file://PATH, or postgres://... / postgresql://... (add kpar_table=NAME for a table other than kpar_dead_letters) (required)"

// cmdDLQ lists, analyses and replays dead letters from any of the
// deadletter package's sources.
func cmdDLQ(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	sub := ""
	if len(args) > 0 {
		sub = args[0]
	}
	switch sub {
	case "stats":
		return dlqStats(ctx, args[1:], stdout, stderr)
	case "list":
		return dlqList(ctx, args[1:], stdout, stderr)
	case "replay":
		return dlqReplay(ctx, args[1:], stdout, stderr)
	case "-h", "--help", "-help", "help":
		dlqUsage(stdout)
		return 0
	case "":
		dlqUsage(stderr)
		return 2
	}
	fmt.Fprintf(stderr, "kpar dlq: unknown subcommand %q; want stats, list or replay\n", sub)
	return 2
}

func dlqUsage(w io.Writer) {
	fmt.Fprint(w, `usage: kpar dlq SUBCOMMAND --source URL [flags]

subcommands:
  stats    count dead letters by error class, by error message, by original partition
  list     print dead letters, oldest first within each partition
  replay   send dead letters back to Kafka, at most once per run id

Sources: kafka://HOST:PORT[,...]/TOPIC[,...] (kpar, Spring Kafka, Kafka Connect
and Kafka Streams dead-letter topics), file://PATH (kpar's JSON Lines files),
postgres://... or postgresql://... (kpar's table; kpar_table=NAME picks another).
Each letter names the consumer group that gave up on it; one source may
hold the letters of several groups, and --group picks one group's.
Run 'kpar dlq SUBCOMMAND --help' for its flags. Every flag also reads KPAR_<FLAG>.
`)
}

// dlqCommon holds the flags every dlq subcommand takes.
type dlqCommon struct {
	fs     *flagSet
	source *string
	class  *string
	group  *string
	sec    *securityOpts
}

func newDLQFlags(name, synopsis string, stderr io.Writer) *dlqCommon {
	fs := newFlagSet("dlq "+name, synopsis, stderr)
	return &dlqCommon{
		fs:     fs,
		source: fs.String("source", "", dlqSourceHelp),
		class:  fs.String("error-class", "", "only dead letters of `CLASS`: permanent, exhausted, timeout, panic or unknown"),
		group:  fs.String("group", "", "only dead letters of consumer group `G`, as each letter records it (__dlq.errors.group; Spring's kafka_dlt-original-consumer-group; connect-<connector> for Kafka Connect's); without it, the letters of every group are read and a line on stderr says when several were merged"),
		sec:    securityFlags(fs),
	}
}

// check validates the common flags after parsing; it returns the exit code
// and false on bad usage.
func (c *dlqCommon) check() (int, bool) {
	if c.fs.NArg() > 0 {
		return c.fs.usageError("unexpected argument %q", c.fs.Arg(0)), false
	}
	if strings.TrimSpace(*c.source) == "" {
		return c.fs.usageError("missing --source (or %s)", envName("source")), false
	}
	if *c.class != "" && !deadletter.Class(*c.class).Valid() {
		return c.fs.usageError("invalid --error-class %q: want permanent, exhausted, timeout, panic or unknown", *c.class), false
	}
	if _, err := c.sec.kgoOpts(); err != nil {
		return c.fs.usageError("%v", err), false
	}
	scheme, _, _ := strings.Cut(*c.source, "://")
	switch scheme {
	case "kafka", "file", "postgres", "postgresql":
	default:
		return c.fs.usageError("invalid --source %q: want kafka://, file://, postgres:// or postgresql://", *c.source), false
	}
	return 0, true
}

// open opens the --source, with the security flags for Kafka.
func (c *dlqCommon) open(ctx context.Context) (deadletter.Source, error) {
	switch scheme, _, _ := strings.Cut(*c.source, "://"); strings.ToLower(scheme) {
	case "postgres", "postgresql":
		return pgsink.OpenSource(*c.source)
	case "kafka":
	default:
		return deadletter.OpenSource(ctx, *c.source)
	}
	brokers, topics, err := deadletter.ParseKafkaURL(*c.source)
	if err != nil {
		return nil, err
	}
	opts, err := c.sec.kgoOpts()
	if err != nil {
		return nil, err
	}
	if err := c.sec.checkBrokers(ctx, brokers, dlqConnectTimeout); err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, dlqConnectTimeout)
	defer cancel()
	return deadletter.OpenKafkaSource(cctx, brokers, topics, opts...)
}

// keep reports whether l passes the --error-class and --group filters.
func (c *dlqCommon) keep(l deadletter.Letter) bool {
	return (*c.class == "" || string(l.Class) == *c.class) && (*c.group == "" || l.Group == *c.group)
}

// groupCounts counts letters per group, so that a command reading the
// letters of several groups can say so.
type groupCounts map[string]int

// merged is the line that tells the user the letters of several groups
// were read together, or "" for one group (or --group).
func (g groupCounts) merged(name string) string {
	if len(g) < 2 {
		return ""
	}
	names := make([]string, 0, len(g))
	for k := range g {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s (%d)", dlqGroupName(k), g[k])
	}
	return fmt.Sprintf("kpar dlq %s: dead letters of %d groups merged: %s; pass --group G for one group's", name, len(g), strings.Join(parts, ", "))
}

// dlqGroupName shows a letter without a group (Kafka Streams records none).
func dlqGroupName(g string) string {
	if g == "" {
		return "(no group)"
	}
	return g
}

func dlqFail(stderr io.Writer, name string, err error) int {
	fmt.Fprintf(stderr, "kpar dlq %s: %v\n", name, err)
	return 1
}

// ---- stats ----

type dlqCount struct {
	Message   string `json:"message,omitempty"`
	Topic     string `json:"topic,omitempty"`
	Partition *int32 `json:"partition,omitempty"`
	Count     int    `json:"count"`
}

type dlqStatsReport struct {
	Total              int            `json:"total"`
	OldestLastFailure  *time.Time     `json:"oldest_last_failure"`
	NewestLastFailure  *time.Time     `json:"newest_last_failure"`
	UnknownLastFailure int            `json:"unknown_last_failure"`
	ByGroup            map[string]int `json:"by_group"` // "" for letters that record no group
	ByClass            map[string]int `json:"by_class"`
	ByMessage          []dlqCount     `json:"by_message"`
	ByPartition        []dlqCount     `json:"by_partition"`
}

func dlqStats(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newDLQFlags("stats", dlqStatsUsage, stderr)
	asJSON := c.fs.Bool("json", false, "print one JSON object instead of text")
	if code, ok := c.fs.parse(args); !ok {
		return code
	}
	if code, ok := c.check(); !ok {
		return code
	}
	src, err := c.open(ctx)
	if err != nil {
		return dlqFail(stderr, "stats", err)
	}
	rep, err := collectStats(ctx, src, c.keep)
	if err != nil {
		return dlqFail(stderr, "stats", err)
	}
	if line := groupCounts(rep.ByGroup).merged("stats"); line != "" {
		fmt.Fprintln(stderr, line)
	}
	if *asJSON {
		if err := rep.writeJSON(stdout); err != nil {
			return dlqFail(stderr, "stats", err)
		}
		return 0
	}
	rep.writeText(stdout)
	return 0
}

// dlqStatsUsage is kpar dlq stats' synopsis and description.
const dlqStatsUsage = ` --source URL [--group G] [--error-class C] [--json]

Reads every dead letter of the source once and prints: the total; the oldest
and newest last failure; counts by consumer group (a record that two groups
dead-lettered counts once for each); by error class; by error message,
normalised (first line only, UUIDs, hex strings and numbers replaced by
<uuid>, <hex> and <n>, blanks collapsed), most frequent first; and by
original topic/partition. --json prints the same as one JSON object.`

// collectStats reads every letter of src that keep keeps into a report.
func collectStats(ctx context.Context, src deadletter.Source, keep func(deadletter.Letter) bool) (dlqStatsReport, error) {
	rep := dlqStatsReport{ByGroup: map[string]int{}, ByClass: map[string]int{}}
	byMsg := map[string]int{}
	byTP := map[topicPartition]int{}
	err := src.Read(ctx, func(l deadletter.Letter) error {
		if !keep(l) {
			return nil
		}
		rep.Total++
		rep.ByGroup[l.Group]++
		rep.ByClass[string(l.Class)]++
		byMsg[dlqNormalise(l.Message)]++
		byTP[topicPartition{l.Record.Topic, l.Record.Partition}]++
		rep.addLastFailure(l.LastFailure)
		return nil
	})
	if err != nil {
		return rep, err
	}
	rep.sortCounts(byMsg, byTP)
	for _, t := range []*time.Time{rep.OldestLastFailure, rep.NewestLastFailure} {
		if t != nil {
			*t = t.UTC()
		}
	}
	return rep, nil
}

// topicPartition is a letter's original partition.
type topicPartition struct {
	topic string
	p     int32
}

// addLastFailure counts a letter's last failure t.
func (rep *dlqStatsReport) addLastFailure(t time.Time) {
	if t.IsZero() {
		rep.UnknownLastFailure++
		return
	}
	if rep.OldestLastFailure == nil || t.Before(*rep.OldestLastFailure) {
		rep.OldestLastFailure = &t
	}
	if rep.NewestLastFailure == nil || t.After(*rep.NewestLastFailure) {
		rep.NewestLastFailure = &t
	}
}

// sortCounts lists the counts by message, the largest first, and by
// partition, in order.
func (rep *dlqStatsReport) sortCounts(byMsg map[string]int, byTP map[topicPartition]int) {
	for m, n := range byMsg {
		rep.ByMessage = append(rep.ByMessage, dlqCount{Message: m, Count: n})
	}
	sort.Slice(rep.ByMessage, func(i, j int) bool {
		a, b := rep.ByMessage[i], rep.ByMessage[j]
		return a.Count > b.Count || a.Count == b.Count && a.Message < b.Message
	})
	for k, n := range byTP {
		p := k.p
		rep.ByPartition = append(rep.ByPartition, dlqCount{Topic: k.topic, Partition: &p, Count: n})
	}
	sort.Slice(rep.ByPartition, func(i, j int) bool {
		a, b := rep.ByPartition[i], rep.ByPartition[j]
		return a.Topic < b.Topic || a.Topic == b.Topic && *a.Partition < *b.Partition
	})
}

// writeJSON prints the report as one JSON object.
func (rep dlqStatsReport) writeJSON(stdout io.Writer) error {
	if rep.ByMessage == nil {
		rep.ByMessage = []dlqCount{}
	}
	if rep.ByPartition == nil {
		rep.ByPartition = []dlqCount{}
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// writeText prints the report as text.
func (rep dlqStatsReport) writeText(stdout io.Writer) {
	fmt.Fprintf(stdout, "dead letters: %d\n", rep.Total)
	fmt.Fprintf(stdout, "oldest last failure: %s\n", dlqTimePtr(rep.OldestLastFailure))
	fmt.Fprintf(stdout, "newest last failure: %s\n", dlqTimePtr(rep.NewestLastFailure))
	if rep.UnknownLastFailure > 0 {
		fmt.Fprintf(stdout, "unknown last failure: %d\n", rep.UnknownLastFailure)
	}
	if rep.Total == 0 {
		return
	}
	fmt.Fprintln(stdout, "\nby group:")
	for _, k := range byCount(rep.ByGroup) {
		fmt.Fprintf(stdout, "  %7d  %s\n", rep.ByGroup[k], dlqGroupName(k))
	}
	fmt.Fprintln(stdout, "\nby error class:")
	for _, k := range byCount(rep.ByClass) {
		fmt.Fprintf(stdout, "  %7d  %s\n", rep.ByClass[k], k)
	}
	fmt.Fprintln(stdout, "\nby error message (normalised):")
	for _, m := range rep.ByMessage {
		fmt.Fprintf(stdout, "  %7d  %s\n", m.Count, m.Message)
	}
	fmt.Fprintln(stdout, "\nby original topic/partition:")
	for _, p := range rep.ByPartition {
		fmt.Fprintf(stdout, "  %7d  %s/%d\n", p.Count, p.Topic, *p.Partition)
	}
}

// byCount returns the keys of m, the largest count first, then by name.
func byCount(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		return m[a] > m[b] || m[a] == m[b] && a < b
	})
	return keys
}

func dlqTimePtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return dlqTime(*t)
}

func dlqTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

var (
	dlqUUIDRE   = regexp.MustCompile(`\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b`)
	dlqHex0xRE  = regexp.MustCompile(`\b0[xX][0-9a-fA-F]+\b`)
	dlqHexRunRE = regexp.MustCompile(`\b[0-9a-fA-F]{8,}\b`)
	dlqDigitsRE = regexp.MustCompile(`[0-9]+`)
	dlqBlanksRE = regexp.MustCompile(`\s+`)
	dlqRunIDRE  = regexp.MustCompile(`^[A-Za-z0-9._-]{1,200}$`)
)

// dlqNormalise groups error messages that differ only in ids and
// numbers: the first line, UUIDs as <uuid>, hex strings (0x..., or 8+ hex
// digits mixing digits and letters) as <hex>, digit runs as <n>, blanks
// collapsed, at most 200 characters.
func dlqNormalise(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	s = dlqUUIDRE.ReplaceAllString(s, "<uuid>")
	s = dlqHex0xRE.ReplaceAllString(s, "<hex>")
	s = dlqHexRunRE.ReplaceAllStringFunc(s, func(m string) string {
		if strings.IndexAny(m, "0123456789") >= 0 && strings.IndexAny(m, "abcdefABCDEF") >= 0 {
			return "<hex>"
		}
		return m
	})
	s = dlqDigitsRE.ReplaceAllString(s, "<n>")
	s = strings.TrimSpace(dlqBlanksRE.ReplaceAllString(s, " "))
	if utf8.RuneCountInString(s) > 200 {
		s = string([]rune(s)[:200]) + "…"
	}
	if s == "" {
		s = "(no message)"
	}
	return s
}

// ---- list ----

func dlqList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := newDLQFlags("list", ` --source URL [--limit N] [--since DURATION|RFC3339] [--group G] [--error-class C] [--json]

Prints the dead letters of the source in its order (append order for files
and tables, offset order within each partition for Kafka), one per line:
last failure, class, original topic/partition/offset, attempts, group,
what the sink left out of a letter too large for its topic (cut=value,...),
and the first line of the error, then, indented, the record's value:
pretty JSON when it is JSON, the text when it is UTF-8, else base64 (cut
at 4 KiB). --json prints one JSON object per line
instead, in the format of kpar's file sink, so the output can itself be
read back with --source file://PATH.`, stderr)
	limit := c.fs.Int("limit", 0, "print at most `N` dead letters (default all)")
	since := c.fs.String("since", "", "only dead letters whose last failure is at or after `T`: a duration back from now (90m, 24h) or an RFC 3339 time")
	asJSON := c.fs.Bool("json", false, "print JSON Lines instead of text")
	registry := addDLQRegistryFlag(c.fs) // dlq_typed.go
	if code, ok := c.fs.parse(args); !ok {
		return code
	}
	if code, ok := c.check(); !ok {
		return code
	}
	decodeLetter, err := dlqDecoder(*registry)
	if err != nil {
		return c.fs.usageError("invalid --schema-registry: %v", err)
	}
	if *limit < 0 {
		return c.fs.usageError("invalid --limit %d: must be 0 (all) or more", *limit)
	}
	var from time.Time
	if *since != "" {
		t, err := dlqParseSince(*since, time.Now())
		if err != nil {
			return c.fs.usageError("invalid --since %q: want a duration (24h) or an RFC 3339 time", *since)
		}
		from = t
	}
	src, err := c.open(ctx)
	if err != nil {
		return dlqFail(stderr, "list", err)
	}
	errLimit := errors.New("limit reached")
	n := 0
	groups := groupCounts{}
	err = src.Read(ctx, func(l deadletter.Letter) error {
		if !c.keep(l) || (!from.IsZero() && (l.LastFailure.IsZero() || l.LastFailure.Before(from))) {
			return nil
		}
		groups[l.Group]++
		if *asJSON {
			b, err := deadletter.MarshalJSONLine(l)
			if err != nil {
				return err
			}
			stdout.Write(append(b, '\n'))
		} else {
			msg, _, _ := strings.Cut(l.Message, "\n")
			fmt.Fprintf(stdout, "%-24s  %-9s  %s  attempts=%d  group=%s  %s%s\n",
				dlqTime(l.LastFailure), l.Class, l.ID(), l.Attempts, dlqOrDash(l.Group), dlqCut(l), strings.TrimSpace(msg))
			if !decodeLetter(ctx, stdout, l) { // dlq_typed.go
				writeDLQValue(stdout, l.Record)
			}
		}
		n++
		if *limit > 0 && n >= *limit {
			return errLimit
		}
		return nil
	})
	if err != nil && !errors.Is(err, errLimit) {
		return dlqFail(stderr, "list", err)
	}
	if line := groups.merged("list"); line != "" {
		fmt.Fprintln(stderr, line)
	}
	return 0
}

// dlqCut says what the sink left out of a letter too large for its topic
// ("cut=value,key  "), or "".
func dlqCut(l deadletter.Letter) string {
	if !l.Truncated() {
		return ""
	}
	var parts []string
	for _, h := range l.Record.Headers {
		switch h.Key {
		case deadletter.HeaderValueTruncated:
			parts = append(parts, "value")
		case deadletter.HeaderKeyTruncated:
			parts = append(parts, "key")
		case deadletter.HeaderHeadersDropped:
			parts = append(parts, "headers")
		}
	}
	return "cut=" + strings.Join(parts, ",") + "  "
}

func dlqOrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// dlqParseSince reads --since: a duration back from now, or an RFC 3339 time.
func dlqParseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d < 0 {
			return time.Time{}, errors.New("negative duration")
		}
		return now.Add(-d), nil
	}
	return time.Parse(time.RFC3339Nano, s)
}

// ---- replay ----

func dlqReplay(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	r, code, ok := parseReplay(args, stderr)
	if !ok {
		return code
	}
	state, code, ok := r.journal()
	if !ok {
		return code
	}
	seeds, code, ok := r.seeds()
	if !ok {
		return code
	}
	src, err := r.open(ctx)
	if err != nil {
		return dlqFail(stderr, "replay", err)
	}
	var cl *kgo.Client
	if seeds != nil {
		if cl, err = r.client(ctx, seeds); err != nil {
			return dlqFail(stderr, "replay", err)
		}
		defer cl.Close()
	}
	groups := groupCounts{}
	rep, err := deadletter.Replay(ctx, src, cl, r.opts(state, groups, stdout)...)
	if line := groups.merged("replay"); line != "" {
		fmt.Fprintf(stderr, "%s (a record several of them dead-lettered is sent once)\n", line)
	}
	if err != nil {
		return dlqFail(stderr, "replay", err)
	}
	r.report(rep, state, stdout, stderr)
	return 0
}

// dlqReplayUsage is kpar dlq replay's synopsis and description.
const dlqReplayUsage = ` --source URL [--to TOPIC] [--brokers LIST] [--group G] [--error-class C] [--dry-run] [--run-id ID]

Sends the dead letters of the source back to Kafka: to each one's original
topic, or to --to, on the partition with the original's number (modulo the
target's partition count), in source order. A replayed record has the
original key, value and headers, plus the headers kpar-replayed-from (the
original's topic/partition/offset) and kpar-replay-run (the run id), and the
time of the replay as its timestamp. Brokers: --brokers, else the source's
for a kafka:// source. A record that several groups dead-lettered is sent
once; every group consuming the target reads it, so to replay one group's
letters to that group only, pass --group and --to a topic only it reads.

Re-running is safe. A replay is a run with an id, by default derived from
--source, --to, --error-class and --group, so running the same command again resumes
the same run; pass --run-id to start another one. The run's journal is
STATE-DIR/RUN-ID.journal: before each batch of up to 500 records it records
the batch's ids and the target partitions' end offsets, and after the
brokers acknowledged the batch it records the ids as sent (each line
fsynced; the file is locked while a run is active). A re-run:
  - skips every dead letter the journal records as sent;
  - if the previous run died while a batch was in flight, first reads the
    target partitions from the journaled end offsets and treats the
    records carrying this run id in kpar-replay-run as sent, then sends the
    rest of that batch;
  - sends dead letters that reached the source since the last run.
So each dead letter is sent once per run id, across crashes, as long as the
journal is kept; without it (another machine, a deleted file) or with
another run id everything is sent again. --dry-run sends nothing, writes
nothing, and prints what a run would send now.`

// replayFlags are kpar dlq replay's flags.
type replayFlags struct {
	*dlqCommon
	to, brokers, runID, stateDir *string
	dryRun                       *bool
}

// parseReplay defines kpar dlq replay's flags, parses args and checks
// them.
func parseReplay(args []string, stderr io.Writer) (*replayFlags, int, bool) {
	r := &replayFlags{dlqCommon: newDLQFlags("replay", dlqReplayUsage, stderr)}
	r.to = r.fs.String("to", "", "replay every dead letter to `TOPIC` (default each one's original topic)")
	r.brokers = r.fs.String("brokers", "", "seed brokers `host:port,...` to replay to (default the source's, for a kafka:// source)")
	r.dryRun = r.fs.Bool("dry-run", false, "print what would be replayed; send and write nothing")
	r.runID = r.fs.String("run-id", "", "replay run `ID` ([A-Za-z0-9._-]; default derived from --source, --to, --error-class and --group)")
	r.stateDir = r.fs.String("state-dir", "", "`DIR` of replay journals (default $XDG_STATE_HOME/kpar/replay, else ~/.local/state/kpar/replay)")
	if code, ok := r.fs.parse(args); !ok {
		return nil, code, false
	}
	if code, ok := r.check(); !ok {
		return nil, code, false
	}
	return r, 0, true
}

// journal is the run's journal file ("" in a dry run without a state
// directory), after setting the run id when none is given.
func (r *replayFlags) journal() (state string, code int, ok bool) {
	if *r.runID == "" {
		parts := []string{*r.source, *r.to, *r.class}
		if *r.group != "" { // added only when given: the ids of runs without it stay as they were
			parts = append(parts, *r.group)
		}
		sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
		*r.runID = "replay-" + hex.EncodeToString(sum[:8])
	} else if !dlqRunIDRE.MatchString(*r.runID) {
		return "", r.fs.usageError("invalid --run-id %q: want 1 to 200 of [A-Za-z0-9._-]", *r.runID), false
	}
	dir := *r.stateDir
	if dir == "" {
		var err error
		if dir, err = dlqStateDir(); err != nil && !*r.dryRun {
			return "", r.fs.usageError("missing --state-dir: %v", err), false
		}
	}
	if dir == "" {
		return "", 0, true
	}
	return filepath.Join(dir, *r.runID+".journal"), 0, true
}

// seeds are the brokers to replay to: --brokers, else the source's; nil
// in a dry run without either.
func (r *replayFlags) seeds() (seeds []string, code int, ok bool) {
	var err error
	switch {
	case *r.brokers != "":
		if seeds, err = splitBrokers(*r.brokers); err != nil {
			return nil, r.fs.usageError("invalid --brokers: %v", err), false
		}
	case strings.HasPrefix(*r.source, "kafka://"):
		if seeds, _, err = deadletter.ParseKafkaURL(*r.source); err != nil {
			return nil, r.fs.usageError("invalid --source: %v", err), false
		}
	case !*r.dryRun:
		return nil, r.fs.usageError("missing --brokers (or %s): needed to replay from a file or PostgreSQL source", envName("brokers")), false
	}
	return seeds, 0, true
}

// client is the producer of the replay, once the brokers answered.
func (r *replayFlags) client(ctx context.Context, seeds []string) (*kgo.Client, error) {
	secOpts, _ := r.sec.kgoOpts()
	if err := r.sec.checkBrokers(ctx, seeds, dlqConnectTimeout); err != nil {
		return nil, err
	}
	return kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(seeds...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	}, secOpts...)...)
}

// opts are the replay's options: the run, its journal (state), the
// filters (counting the kept letters per group in groups), and in a dry
// run a line on stdout per letter.
func (r *replayFlags) opts(state string, groups groupCounts, stdout io.Writer) []deadletter.ReplayOpt {
	opts := []deadletter.ReplayOpt{
		deadletter.ReplayRunID(*r.runID),
		deadletter.ReplayStateFile(state),
		deadletter.ReplayTo(*r.to),
		deadletter.ReplayFilter(func(l deadletter.Letter) bool {
			if !r.keep(l) {
				return false
			}
			groups[l.Group]++
			return true
		}),
	}
	if *r.dryRun {
		opts = append(opts, deadletter.ReplayDryRun(), deadletter.ReplayOnLetter(func(e deadletter.ReplayEvent) {
			printReplayEvent(stdout, e)
		}))
	}
	return opts
}

// printReplayEvent is a dry run's line on a letter.
func printReplayEvent(stdout io.Writer, e deadletter.ReplayEvent) {
	part := "?"
	if e.Partition >= 0 {
		part = fmt.Sprint(e.Partition)
	}
	what := "would replay"
	switch {
	case e.Truncated:
		what = "cut by the sink"
	case e.Duplicate:
		what = "same record"
	case e.Skipped:
		what = "already replayed"
	case e.InDoubt:
		what = "in doubt"
	}
	fmt.Fprintf(stdout, "%-16s  %s -> %s[%s]  %s  group=%s\n", what, e.Letter.ID(), e.Topic, part, e.Letter.Class, dlqOrDash(e.Letter.Group))
}

// report prints the run's account.
func (r *replayFlags) report(rep deadletter.ReplayReport, state string, stdout, stderr io.Writer) {
	if rep.Truncated > 0 {
		fmt.Fprintf(stderr, "kpar dlq replay: %d dead letters were too large for their topic and were written with parts of the record left out (kpar.value.truncated and the like): they are not replayed; 'kpar dlq list' shows their coordinates, so replay them from the source topic while its retention keeps them\n", rep.Truncated)
	}
	if *r.dryRun {
		fmt.Fprintf(stdout, "dry run %s: %d would be replayed, %d already replayed, %d in doubt (a run checks the target for them first), %d of a record another group's letter already took, %d cut by the sink, %d filtered out, of %d read; journal %s\n",
			rep.RunID, rep.Replayed, rep.Skipped, rep.InDoubt, rep.Duplicate, rep.Truncated, rep.Filtered, rep.Read, dlqOrDash(state))
		return
	}
	fmt.Fprintf(stdout, "run %s: replayed %d, already replayed %d, found sent after an interruption %d, same record as another group's letter %d, cut by the sink %d, filtered out %d, of %d read; journal %s\n",
		rep.RunID, rep.Replayed, rep.Skipped, rep.Recovered, rep.Duplicate, rep.Truncated, rep.Filtered, rep.Read, state)
}

// dlqStateDir is $XDG_STATE_HOME/kpar/replay, else
// ~/.local/state/kpar/replay.
func dlqStateDir() (string, error) {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "kpar", "replay"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return "", errors.New("no $XDG_STATE_HOME and no home directory")
	}
	return filepath.Join(home, ".local", "state", "kpar", "replay"), nil
}
