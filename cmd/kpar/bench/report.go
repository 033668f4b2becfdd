package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// WriteJSON writes the report as one indented JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteMarkdown writes the report as a Markdown table, one row per run;
// the commits scenario's cells follow in a table of their own.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	var runs, commits []Result
	for _, res := range r.Results {
		if res.Scenario == Commits {
			commits = append(commits, res)
		} else {
			runs = append(runs, res)
		}
	}
	if len(runs) > 0 {
		runsTable(&b, runs)
	}
	if len(commits) > 0 {
		if len(runs) > 0 {
			b.WriteString("\n")
		}
		commitsTable(&b, commits)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func runsTable(b *strings.Builder, rs []Result) {
	b.WriteString("| scenario | variant | contender | records | records/s | ratio | p50 | p99 | peak RSS | peak heap | lost | dups | note |\n")
	b.WriteString("|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, res := range rs {
		rate := "-"
		if res.RecordsPerSec > 0 && res.Scenario != Crash {
			rate = commas(int64(res.RecordsPerSec))
		}
		ratio := "-"
		if res.RatioTo != "" {
			ratio = fmt.Sprintf("%.2f× %s", res.Ratio, res.RatioTo)
		}
		note := res.Note
		if res.Err != "" {
			note = join("**error**: "+res.Err, note)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			res.Scenario, dash(res.Variant), res.Contender, commas(res.Records), rate, ratio,
			msCell(res.P50Ms), msCell(res.P99Ms), mib(res.PeakRSS), mib(res.PeakHeap),
			commas(res.Lost), commas(res.Duplicates), strings.ReplaceAll(note, "|", "\\|"))
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func msCell(v *float64) string {
	switch {
	case v == nil:
		return "-"
	case *v < 10:
		return fmt.Sprintf("%.2f ms", *v)
	}
	return fmt.Sprintf("%.0f ms", *v)
}

func mib(n int64) string {
	if n <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// commas formats n with thousands separators.
func commas(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
