package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/kpar/kpar"
)

// demoProgress is one snapshot for the progress display.
type demoProgress struct {
	elapsed    time.Duration
	produced   int64
	handled    int64
	duplicates int64
	violations int64
	failures   int64
	committed  int64
	inFlight   int
	parts      []kpar.PartitionStats // nil once the consumer stopped
}

func (d *demo) progress(start time.Time, parts []kpar.PartitionStats) demoProgress {
	p := demoProgress{
		elapsed:   time.Since(start),
		produced:  d.produced.Load(),
		failures:  d.failures.Load(),
		committed: d.commits.total(),
		parts:     parts,
	}
	rep := d.ledger.Report()
	p.handled, p.duplicates, p.violations = rep.Handled, rep.Duplicates, rep.OrderViolations
	for _, s := range parts {
		p.inFlight += s.InFlight
	}
	return p
}

// demoView draws progress on stderr: in place on a terminal, one line a
// second otherwise.
type demoView struct {
	w     io.Writer
	d     *demo
	fd    int                   // the terminal's file descriptor, when tty
	tty   bool                  // redraw in place
	lines int                   // lines of the frame last drawn, to move back over
	last  []kpar.PartitionStats // the partitions last seen while running
	note  string                // shown under the table when set
	rate  rateMeter
}

func newDemoView(w io.Writer, d *demo) *demoView {
	v := &demoView{w: w, d: d}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) && os.Getenv("TERM") != "dumb" {
		v.fd, v.tty = int(f.Fd()), true
	}
	v.rate.add(time.Now(), 0)
	return v
}

func (v *demoView) interval() time.Duration {
	if v.tty {
		return 200 * time.Millisecond
	}
	return time.Second
}

func (v *demoView) draw(p demoProgress) {
	rate := v.rate.add(time.Now(), p.handled)
	if p.parts != nil {
		v.last = p.parts
	}
	if !v.tty {
		fmt.Fprintf(v.w, "kpar demo: %5.1fs  produced %d  handled %d/%d (%.0f%%)  %.0f records/s  in flight %d  committed %d%s\n",
			p.elapsed.Seconds(), p.produced, p.handled, v.d.records, percent(p.handled, v.d.records),
			rate, p.inFlight, p.committed, v.extras(p))
		return
	}
	width, height := 80, 24
	if w, h, err := term.GetSize(v.fd); err == nil {
		width, height = w, h
	}
	var b strings.Builder
	if v.lines > 0 {
		// Back to the first line of the previous frame, and clear below.
		fmt.Fprintf(&b, "\x1b[%dF\x1b[J", v.lines)
	}
	lines := 0
	line := func(format string, a ...any) {
		// A line wider than the terminal would wrap and break the count
		// of lines to move back over.
		s := []rune(fmt.Sprintf(format, a...))
		b.WriteString(string(s[:min(len(s), width-1)]))
		b.WriteByte('\n')
		lines++
	}
	line("kpar demo: %d records, %d keys, %d partitions, ordering %v, concurrency %d",
		v.d.records, v.d.keys, v.d.partitions, v.d.ordering, v.d.concurrency)
	line("%9s %10s %10s %10s %10s %10s %7s", "partition", "start", "end", "buffered", "in flight", "committed", "paused")
	// Keep the frame within the screen, with room for the "more" line.
	rows := len(p.parts)
	if rows > height-5 {
		rows = max(height-6, 0)
	}
	for _, s := range p.parts[:rows] {
		paused := ""
		if s.Paused {
			paused = "yes"
		}
		line("%9d %10s %10s %10d %10d %10s %7s", s.Partition, offset(s.Start), offset(s.End),
			s.Buffered, s.InFlight, offset(s.Committed), paused)
	}
	switch {
	case rows < len(p.parts):
		line("      ... %d more partitions", len(p.parts)-rows)
	case p.parts == nil && p.handled < int64(v.d.records):
		line("      (waiting for the partition assignment)")
	case p.parts == nil:
		line("      (consumer stopped)")
	}
	line("produced %d  committed %d%s", p.produced, p.committed, v.extras(p))
	if v.note != "" {
		line("%s", v.note)
	}
	const barWidth = 20
	filled := int(math.Round(percent(p.handled, v.d.records) / 100 * barWidth))
	line("[%s%s] %3.0f%%  %d/%d handled  %.0f rec/s  in flight %d  %.1fs",
		strings.Repeat("█", filled), strings.Repeat("░", barWidth-filled),
		percent(p.handled, v.d.records), p.handled, v.d.records, rate, p.inFlight, p.elapsed.Seconds())
	v.lines = lines
	io.WriteString(v.w, b.String())
}

// status shows a note: at once on its own line, or in the frames to come
// on a terminal.
func (v *demoView) status(note string) {
	if v.tty {
		v.note = note
		return
	}
	fmt.Fprintf(v.w, "kpar demo: %s\n", note)
}

// finish draws the last frame, after the consumer stopped: the partitions
// as last seen, with the offsets of the final commit.
func (v *demoView) finish(p demoProgress) {
	if !v.tty {
		return
	}
	p.parts = slices.Clone(v.last)
	for i := range p.parts {
		if o, ok := v.d.commits.offset(p.parts[i].Partition); ok {
			p.parts[i].Committed = o
		}
	}
	v.draw(p)
}

// extras shows the counters that are usually 0 only when they are not.
func (v *demoView) extras(p demoProgress) string {
	var s string
	if p.failures > 0 {
		s += fmt.Sprintf("  failed attempts %d", p.failures)
	}
	if p.duplicates > 0 {
		s += fmt.Sprintf("  duplicates %d", p.duplicates)
	}
	if p.violations > 0 {
		s += fmt.Sprintf("  order violations %d", p.violations)
	}
	return s
}

func offset(o int64) string {
	if o < 0 {
		return "-"
	}
	return strconv.FormatInt(o, 10)
}

func percent(n int64, of int) float64 { return 100 * float64(n) / float64(of) }

// rateMeter computes records/s over about the last second.
type rateMeter struct {
	samples []rateSample
}

type rateSample struct {
	t time.Time
	n int64
}

func (m *rateMeter) add(t time.Time, n int64) float64 {
	m.samples = append(m.samples, rateSample{t, n})
	// Keep as the base the newest sample that is at least a second old.
	for len(m.samples) > 2 && t.Sub(m.samples[1].t) >= time.Second {
		m.samples = m.samples[1:]
	}
	base := m.samples[0]
	if dt := t.Sub(base.t).Seconds(); dt > 0 {
		return float64(n-base.n) / dt
	}
	return 0
}

func (d *demo) printSummary(w io.Writer, s *demoSummary) {
	fmt.Fprintf(w, "\nkpar demo: %d records on %d partitions, %d keys, ordering %v, concurrency %d\n",
		d.records, d.partitions, d.keys, d.ordering, d.concurrency)
	fmt.Fprintf(w, "  produced          %d\n", s.Produced)
	fmt.Fprintf(w, "  handled           %d\n", s.Handled)
	fmt.Fprintf(w, "  duplicates        %d\n", s.Duplicates)
	if s.Lost != nil {
		fmt.Fprintf(w, "  lost              %d\n", *s.Lost)
	} else {
		fmt.Fprintf(w, "  lost              unknown: stopped early with %d records not handled yet\n", s.Produced-s.Handled)
	}
	fmt.Fprintf(w, "  order violations  %d\n", s.OrderViolations)
	fmt.Fprintf(w, "  commit violations %d\n", s.CommitViolations)
	if f := d.failures.Load(); f > 0 {
		fmt.Fprintf(w, "  failed attempts   %d (retried)\n", f)
	}
	fmt.Fprintf(w, "  committed         %d\n", d.commits.total())
	rate := 0.0
	if s.Seconds > 0 {
		rate = float64(s.Handled) / s.Seconds
	}
	fmt.Fprintf(w, "  wall time         %.2fs (%.0f records/s)\n", s.Seconds, rate)
	switch {
	case !d.passed(s):
		fmt.Fprintln(w, "FAILED: kpar broke a guarantee")
	case s.Lost == nil:
		fmt.Fprintln(w, "stopped early: no guarantee broken so far")
	case d.ordering == kpar.Unordered:
		fmt.Fprintln(w, "ok: every record handled; unordered mode keeps no order, so order violations are expected")
	default:
		fmt.Fprintf(w, "ok: every record handled, per-%v order kept\n", d.ordering)
	}
}
