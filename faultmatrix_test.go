package kpar

import (
	"testing"
)

// TestFaultMatrix is the short fault matrix of issue 35: each fault at the
// edge of the pipeline (rows) on each way of consuming (columns), judged
// by the rows' ledgers: nothing lost, nothing dead-lettered wrongly (an
// outage, a certificate that stops verifying), the record at fault
// dead-lettered (a record that hangs the downstream), and no run past the
// cell's bound (a stalled commit). The rows are the conformance suite's;
// the columns add the consumer group protocol (KIP-848) to the classic one.
// Readiness under the same faults is judged end to end in cmd/kpar
// (TestForwardHoldsRecordsWhileTheCertificateDoesNotVerify,
// TestBrokerRestartUnderEachProtocol).
func TestFaultMatrix(t *testing.T) {
	rows := []flowRow{
		{"outage", testOutage},
		{"misconfigured", testMisconfigured},
		{"hung-record", testHungRecord},
	}
	cols := []flowSource{
		groupFlowSource("group-classic", ByKey, promisesKeyOrder),
		memberSource("group-consumer", ByKey, promisesKeyOrder, func(cl *cell) []ConsumerOpt {
			return append(testOpts(cl.c, cl.group, cl.topic), GroupProtocol(ConsumerProtocol))
		}),
		shareFlowSource("share", ByKey, promisesKeyExclusive),
		{name: "backfill", promise: promisesNoOrder, endsByItself: true, run: runBackfillSource},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			for _, src := range cols {
				t.Run(src.name, func(t *testing.T) {
					t.Parallel()
					row.test(t, src)
				})
			}
		})
	}
}
