// Package route sends each record to the handler of the first rule whose
// CEL expression (https://cel.dev, the language of Kubernetes' validation
// rules and of Dapr's routing rules) it matches: the filters and routes of
// `kpar forward --filter` and `--route 'EXPR -> URL'`. It lives in a module
// of its own, so that the core package keeps linking only franz-go.
//
// # Rules
//
// A Handler holds an optional filter and a list of rules, each an
// expression and a kpar.Handler (in kpar forward, a forward.Handler per
// URL). For each record it evaluates the filter, then the rules in order;
// the first rule that is true handles the record, and a record no rule
// matches goes to the fallback handler (--url), or, without one, is
// filtered. A filtered record returns nil without calling any handler: it
// finishes, and is committed (or acknowledged) like any other.
//
// # Variables
//
//	key        the key: the decoded JSON when a Decoder decoded it, else a
//	           string when it is valid UTF-8, else bytes; null for no key
//	value      the value: the decoded JSON (an object is a map) when a
//	           Decoder decoded it; the parsed JSON when the record's
//	           content-type header (else ContentType) says JSON; else
//	           bytes; null for a tombstone
//	headers    map(string, string): the record headers (the last of a
//	           repeated name)
//	topic      string
//	partition  int
//	offset     int
//	timestamp  timestamp: the record's timestamp
//
// JSON integers are ints (uint above the int range, double beyond it);
// other numbers are doubles, and ints and doubles compare with each other.
// The value and key are decoded or parsed only when an expression reads
// them, at most once per record (and per attempt); the decoded form is
// handed to the rule's handler with forward.WithDecoded, so that a
// forward.Handler does not decode the record again.
//
// # Failures
//
// Expressions are compiled and type-checked by New: a syntax or type error
// is a *CompileError naming the rule and the position. An expression that
// fails on a record (a field the record lacks, a value that is not JSON, a
// division by zero) counts as false and is counted (Stats); has(value.f)
// and value.?f.orValue(x) test for a field first. A Decoder's error is the
// record's: an overload (the registry is down) holds the record, a
// permanent error (an unknown schema) dead-letters it, as the
// forward.Handler would.
package route
