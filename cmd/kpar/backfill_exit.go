package main

import (
	"fmt"
	"io"

	"github.com/kpar/kpar"
)

// exitDeadLettered is kpar backfill's exit code for a range that is done
// but whose run dead-lettered records: a job in a pipeline (cron, a CI
// step, a Kubernetes Job) must not report success for records the
// endpoint never took. 1 and 2 already mean "could not finish" and "bad
// usage"; 3 tells the caller that the dead letters need a look (kpar dlq)
// and that running the same range again would not help.
const exitDeadLettered = 3

// deadLetteredExit is the exit code of a backfill whose range is done: 0,
// or exitDeadLettered when this run dead-lettered records and
// --allow-dead-letters was not given, saying so on stderr. Records a
// resumed run had finished before (AlreadyDone) are not counted: the run
// that dead-lettered them exited 3 already, or was stopped.
func deadLetteredExit(res kpar.BackfillResult, allow bool, sink deadLetterSink, stderr io.Writer) int {
	if res.DeadLettered == 0 || allow {
		return 0
	}
	fmt.Fprintf(stderr, "kpar backfill: %d of %d records were dead-lettered (to %s): exit %d; read them with kpar dlq, or give --allow-dead-letters to exit 0\n",
		res.DeadLettered, res.Records, sink.describe(), exitDeadLettered)
	return exitDeadLettered
}
