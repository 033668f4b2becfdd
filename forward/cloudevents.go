package forward

import (
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"
)

// CloudEvents defaults (see the CloudEvents option).
const (
	// DefaultCloudEventsSource is the ce-source of a record without a
	// ce_source header; {topic} stands for the record's topic.
	DefaultCloudEventsSource = "kafka://{topic}"
	// DefaultCloudEventsType is the ce-type of a record without a ce_type
	// header.
	DefaultCloudEventsType = "dev.kpar.record"
	// CloudEventsSpecVersion is the ce-specversion kpar sends.
	CloudEventsSpecVersion = "1.0"
)

// cloudEvents makes the ce- headers of the binary content mode of the
// CloudEvents HTTP binding from a record and, where it has them, from its
// ce_ headers (the Kafka binding's binary mode).
type cloudEvents struct {
	source    string
	topicAt   int // where {topic} is in source, or -1
	eventType string
}

func newCloudEvents(source, eventType string) *cloudEvents {
	if source == "" {
		source = DefaultCloudEventsSource
	}
	if eventType == "" {
		eventType = DefaultCloudEventsType
	}
	return &cloudEvents{source: source, topicAt: strings.Index(source, "{topic}"), eventType: eventType}
}

// sourceOf is the ce-source of a record of topic.
func (ce *cloudEvents) sourceOf(topic string) string {
	if ce.topicAt < 0 {
		return ce.source
	}
	return ce.source[:ce.topicAt] + topic + ce.source[ce.topicAt+len("{topic}"):]
}

// The ce- header names, in net/http's canonical form.
const (
	ceSpecVersion = "Ce-Specversion"
	ceID          = "Ce-Id"
	ceSource      = "Ce-Source"
	ceType        = "Ce-Type"
	ceTime        = "Ce-Time"
	ceSubject     = "Ce-Subject"
)

// setHeaders adds the event's attributes of r to hd as ce- headers.
//
// The record's own ce_ headers come first and win: a record produced as a
// CloudEvent (the Kafka binding) keeps its id, source, type, time and
// extensions. kpar fills the required attributes it lacks (specversion,
// id, source, type); time and subject only for a record that is not a
// CloudEvent already (no ce_specversion), since adding them would change
// an event its producer made.
func (ce *cloudEvents) setHeaders(hd http.Header, r *kgo.Record) {
	isEvent := false
	for _, rh := range r.Headers {
		name, ok := ceAttribute(rh.Key)
		if !ok {
			continue
		}
		if name == "specversion" {
			isEvent = true
		}
		hd["Ce-"+strings.ToUpper(name[:1])+name[1:]] = []string{ceHeaderValue(rh.Value)}
	}
	setIfMissing := func(k, v string) {
		if _, ok := hd[k]; !ok {
			hd[k] = []string{v}
		}
	}
	setIfMissing(ceSpecVersion, CloudEventsSpecVersion)
	if _, ok := hd[ceID]; !ok {
		id := make([]byte, 0, len(r.Topic)+24)
		id = append(id, r.Topic...)
		id = append(id, '/')
		id = strconv.AppendInt(id, int64(r.Partition), 10)
		id = append(id, '/')
		id = strconv.AppendInt(id, r.Offset, 10)
		hd[ceID] = []string{ceHeaderValue(id)}
	}
	if _, ok := hd[ceSource]; !ok {
		hd[ceSource] = []string{ceHeaderValue([]byte(ce.sourceOf(r.Topic)))}
	}
	setIfMissing(ceType, ce.eventType)
	if isEvent {
		return
	}
	if _, ok := hd[ceTime]; !ok && r.Timestamp.UnixMilli() >= 0 {
		hd[ceTime] = []string{r.Timestamp.UTC().Format(TimestampLayout)}
	}
	if _, ok := hd[ceSubject]; !ok && len(r.Key) > 0 && utf8.Valid(r.Key) {
		hd[ceSubject] = []string{ceHeaderValue(r.Key)}
	}
}

// ceAttribute returns the attribute name of a record header of the Kafka
// binding: "ce_" (any case) and a valid attribute name, lower-cased.
// datacontenttype is not one: the binding carries it as content-type.
func ceAttribute(k string) (string, bool) {
	if len(k) <= 3 || !strings.EqualFold(k[:3], "ce_") {
		return "", false
	}
	name := strings.ToLower(k[3:])
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return "", false // not a CloudEvents attribute name: left in Kpar-Headers only
		}
	}
	return name, name != "datacontenttype"
}

// ceHeaderValue percent-encodes v as the HTTP binding asks of attribute
// values in headers: space, '"', '%' and every byte outside printable
// ASCII become %XX.
func ceHeaderValue(v []byte) string {
	const hex = "0123456789ABCDEF"
	n := 0
	for _, c := range v {
		if ceEscape(c) {
			n++
		}
	}
	if n == 0 {
		return string(v)
	}
	b := make([]byte, 0, len(v)+2*n)
	for _, c := range v {
		if ceEscape(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
			continue
		}
		b = append(b, c)
	}
	return string(b)
}

func ceEscape(c byte) bool { return c <= ' ' || c > '~' || c == '"' || c == '%' }
