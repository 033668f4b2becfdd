package main

// contentTypeAttrs are the start line's words on what requests carry
// (issue 37: with --batch it said content_type=application/octet-stream
// while every batch request is JSON). One record a request: its bytes,
// under --content-type unless the record has a content-type header. A
// batch: a JSON array, each item's value in base64 and its content_type
// field --content-type unless the record has a header of its own.
func contentTypeAttrs(batch int, contentType string) []any {
	if batch > 1 {
		return []any{"content_type", "application/json", "batch_items", "value in base64, content_type " + contentType + " unless the record has a content-type header"}
	}
	return []any{"content_type", contentType + " unless the record has a content-type header"}
}
