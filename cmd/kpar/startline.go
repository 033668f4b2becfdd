package main

// contentTypeAttrs are the start line's words on what requests carry
// (issue 37: with --batch it said content_type=application/octet-stream
// while every batch request is JSON). One record a request: its bytes,
// under --content-type unless the record has a content-type header. A
// batch: a JSON array, each item's value in base64 and its content_type
// field --content-type unless the record has a header of its own. With
// --schema-registry a decoded value is JSON in either; undecodable says
// what becomes of a value not in the wire format ("raw": sent as above).
func contentTypeAttrs(batch int, contentType string, decoding bool, undecodable string) []any {
	raw := contentType + " unless the record has a content-type header"
	if decoding {
		if undecodable == "raw" {
			raw = "application/json for a decoded value, else " + raw
		} else {
			raw = "application/json (the decoded value)"
		}
	}
	if batch > 1 {
		if decoding && undecodable == "raw" {
			return []any{"content_type", "application/json", "batch_items", "a decoded value as JSON with its form, else the value in base64 with content_type " + contentType + " unless the record has a content-type header"}
		}
		if decoding {
			return []any{"content_type", "application/json", "batch_items", "the decoded value as JSON with its form"}
		}
		return []any{"content_type", "application/json", "batch_items", "value in base64, content_type " + raw}
	}
	return []any{"content_type", raw}
}
