// Package window tracks the in-flight offsets of one partition and derives its
// commit point.
//
// Records of a partition are pushed in fetch order and may finish in any order,
// because kpar processes them concurrently. Kafka's committed offset means "every
// record below this has been processed", so the only safe commit point is the
// offset of the lowest unfinished record: committing anything higher would, after
// a crash or rebalance, skip a record that never finished. Finished records above
// that point are remembered (and can be listed for commit metadata) but do not
// move the commit point until everything below them is done. When every pushed
// record is finished, the commit point is the last pushed offset + 1.
//
// Entries are tracked by their position in fetch order (a Seq), never by offset
// arithmetic. Offsets of a partition are increasing but not contiguous: compaction
// removes records and transaction markers occupy offsets that are never delivered.
// Because the window only ever asks "is the next fetched entry done?", such gaps
// can never stall the commit point waiting for an offset that will not arrive.
//
// A Window is a growable ring buffer: Push, Done and Start are O(1) amortised and
// allocation-free once the ring has grown to the partition's high-water mark of
// in-flight records. It has no goroutines and no locks; the caller serialises
// access (the engine holds the partition's mutex).
package window
