// Package forward is a kpar.Handler that POSTs records to an HTTP endpoint:
// the handler behind `kpar forward`, which makes kpar usable from any
// language that can serve HTTP. It sends one request per record, or, with
// Batch, one request per group of records. The same contract, with a table
// of answers and curl examples, is docs/http-contract.md in the repository.
//
// # Request, one record
//
// Each record becomes one POST to the URL. The body is the record's value,
// sent from the record's own bytes without a copy (an empty body for a nil
// or an empty value; Kpar-Tombstone tells them apart). The headers describe
// the record:
//
//	Content-Type:     the record's own content-type header (any case; the
//	                  last one), else ContentType (default
//	                  application/octet-stream)
//	Kpar-Topic:       the topic
//	Kpar-Partition:   the partition, decimal
//	Kpar-Offset:      the offset, decimal
//	Kpar-Timestamp:   the record's timestamp, RFC 3339 in UTC with milliseconds
//	Kpar-Key:         the key, standard base64 (absent for a nil key, empty
//	                  for an empty one)
//	Kpar-Tombstone:   "true" when the value is nil (a tombstone); absent
//	                  otherwise, so an empty body without it is an empty value
//	Kpar-Headers:     every record header in record order, exact names:
//	                  "name=base64value, name=base64value, ..." (absent when
//	                  the record has none); see below
//	Kpar-Header-<h>:  for each record header h, its value in standard base64;
//	                  a header repeated in the record is repeated here
//	Traceparent, Tracestate: copied from the record's traceparent and
//	                  tracestate headers (W3C trace context), so that the
//	                  endpoint continues the producer's trace
//
// plus the Header values, and with CloudEvents the ce- headers (below).
// Kpar-Topic, Kpar-Partition and Kpar-Offset together are the record's
// idempotency key: kpar delivers at least once, so a record can arrive
// again (after a crash, a rebalance, or a timeout the endpoint survived).
//
// HTTP header names are case-insensitive, so Kpar-Header-<h> merges record
// headers whose names differ only in case ("Trace" and "trace" arrive as
// one header with two values) and a receiver must not rely on the case of
// <h>. It is kept for compatibility; Kpar-Headers is exact: each item is a
// name, '=', and the value in standard base64; items are separated by ", ".
// In both forms the bytes of a record header name that are not HTTP token
// characters (RFC 9110 tchar), and '%' itself, are percent-encoded as %XX,
// upper-case hex, so names never contain '=' or ',' and decode back to the
// exact bytes: "trace id" is sent as trace%20id.
//
// Both forms travel in the request's head, which servers and proxies limit
// (nginx to 8 KiB a line by default, Go to 1 MiB in all): a record with
// large headers can be refused with 431, a permanent error. Batch puts
// the headers in the body instead.
//
// # CloudEvents
//
// With CloudEvents, each request is also a CloudEvent in the binary
// content mode of the CloudEvents HTTP binding, so that a receiver written
// for Knative's KafkaSource or Dapr, or with a CloudEvents SDK, takes it:
//
//	ce-specversion:  1.0
//	ce-id:           <topic>/<partition>/<offset>, unique per record
//	ce-source:       the source given, {topic} replaced (default kafka://{topic})
//	ce-type:         the type given (default dev.kpar.record)
//	ce-time:         the record's timestamp, RFC 3339
//	ce-subject:      the key, when it is non-empty UTF-8 text
//
// and the value as the body, with Content-Type as above (the event's
// datacontenttype). A record that carries ce_* headers (the binary mode of
// the CloudEvents Kafka binding: ce_id, ce_source, ce_type,
// ce_specversion, ce_time, ce_subject, extensions) keeps its attributes:
// each becomes a ce- header, and kpar fills only the required attributes
// it lacks (specversion, id, source, type); a record with ce_specversion
// is an event already and gets no ce-time or ce-subject of kpar's. Values
// are percent-encoded as the HTTP binding asks (space, '"', '%' and bytes
// outside printable ASCII). The Kpar-* headers are sent as well.
//
// # Request, a batch
//
// With Batch(n, wait), records are collected into batches of up to n, sent
// when n records are waiting or wait after the first one arrived. The body
// is a JSON array (Content-Type: application/json), one object per record:
//
//	{"topic": "orders", "partition": 3, "offset": 42,
//	 "timestamp": "2024-05-06T05:08:09.123Z",
//	 "key": "base64" or null (nil key),
//	 "value": "base64" or null (nil value, a tombstone),
//	 "content_type": "application/json",
//	 "headers": {"name": "base64", ...},
//	 "header_list": [["name", "base64"], ...]}
//
// "content_type" is the record's content type by the rule above. "headers"
// maps each record header name to its value (the last one when a name
// repeats); "header_list" has them all, in record order. Names are JSON
// strings (bytes that are not valid UTF-8 become U+FFFD). A batch carries
// Traceparent and Tracestate from its first record that has them; the other
// records' trace context is in their own headers. BatchRecord decodes an
// element in Go.
//
// Batches are made of the records the handler holds at once: kpar's
// ordering gives the handler at most one record per key and partition (Key
// mode) or per partition (Partition mode) at a time, so a batch never holds
// two records whose order matters, whatever the endpoint does with them.
// Batches fill only when kpar runs at least n handlers at once, and kpar's
// Concurrency bounds records, not requests: at Concurrency c about c/n
// batches are in flight. Give kpar a Concurrency of several times n (kpar
// forward uses 8n); fewer keys (Key mode) or partitions (Partition mode)
// than n leave batches partial, sent after wait. The connection pool
// (Concurrency here) only needs c/n connections.
//
// # Response
//
// A 2xx response means the record is done. The others:
//
//	408, 5xx (but 503)       retryable: kpar retries with backoff, then
//	                         dead-letters after MaxAttempts
//	429, 503                 kpar.Overloaded: retried without burning an
//	                         attempt, no sooner than a Retry-After header
//	                         asks (seconds or an HTTP date, capped at
//	                         MaxRetryAfter)
//	other 3xx and 4xx        kpar.Permanent: dead-lettered at once; 307 and
//	                         308 are followed with the body first (without
//	                         the Header values when they leave the host),
//	                         301, 302 and 303 are not (they would lose it)
//	no answer                kpar.Overloaded (connection refused or reset):
//	                         the endpoint is down; kpar's breaker or
//	                         kpar.AdaptiveConcurrency backs off
//	timeout                  kpar.Overloaded, unless the endpoint answered
//	                         another request 2xx while this one waited:
//	                         then retryable (it is this record that hangs)
//	certificate not valid    *TLSError, kpar.Misconfigured: records are held
//	                         (no attempt counted, nothing dead-lettered) and
//	                         the log says what to fix at ERROR (see CheckTLS)
//
// A timeout is the end of the context's deadline (kpar's AttemptTimeout,
// or Timeout) or the client's own. Errors carry a *StatusError when the
// server answered; its text, which kpar logs and puts in the dead letter's
// message, ends with the start of the response body (up to 512 bytes, as
// one line of printable text), which often says what was wrong.
//
// A batch's response applies to all its records, except a 2xx whose body
// is a JSON array with one item per record, in request order, each a
// status code or an object:
//
//	[200, 200, 503]
//	[{"status": 200}, {"status": 422, "error": "no such sku"},
//	 {"status": 503, "retry_after": 2.5}]
//
// Each status is read as that record's own request's (2xx done, 408, 429
// and 5xx retried, other 4xx dead-lettered); "error" (a string) becomes
// StatusError.Reason and so the dead letter's message; "retry_after"
// (seconds) delays that record's retry, capped at MaxRetryAfter. Both are
// optional, and the two forms mix. A 2xx with an empty body finishes every
// record; a 2xx with any other body, or an array of the wrong length, is a
// retryable error for all of them (the endpoint is broken, not the
// records) whose text names the expected shape.
//
// Response bodies are read (up to 64 KiB, more for a batch answer) and
// closed so that connections are reused: the Handler keeps a keep-alive
// pool of Concurrency connections to the endpoint.
//
// # Typed records
//
// With Decode, a Decoder (the module github.com/kpar/kpar/schema decodes
// the Confluent wire format through a Schema Registry) turns each value
// into JSON: the request's body, with Content-Type application/json and
// the Kpar-Value-Form and Kpar-Schema-Id headers (Kpar-Key-Json for a
// decoded key); in a batch, each item's "value" is that JSON and
// "value_form" says so. EncodeReplies encodes the replies with a
// ReplyEncoder. See decode.go and docs/http-contract.md.
package forward
