package schema

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
)

// The Confluent wire format. A serialized value (or key) starts with a
// magic byte and the schema's identity:
//
//	0, then the schema ID as 4 bytes big-endian        (every serializer)
//	1, then the schema's 16-byte GUID                   (Confluent 8 serializers)
//
// or carries no prefix at all when a record header holds the identity
// (HeaderValueSchemaID, HeaderKeySchemaID: the header's value is the
// prefix). For Protobuf, the message indexes follow the identity: a
// zigzag varint count, then that many zigzag varint indexes, the path of
// the message in its file; a lone 0 stands for [0], the file's first
// message.

// Record headers in which newer Confluent serializers carry the schema
// identity instead of the payload prefix.
const (
	HeaderValueSchemaID = "__value_schema_id"
	HeaderKeySchemaID   = "__key_schema_id"
)

const (
	magicID   = 0
	magicGUID = 1
	// maxIndexes bounds the message-index path: deeper nesting than this
	// is not a real schema, and a count read from garbage must not size
	// an allocation.
	maxIndexes = 64
)

// errNotWire says that bytes are not in the wire format at all.
var errNotWire = errors.New("not in the Confluent wire format")

// ref is a schema identity read from a prefix: an ID, or a GUID.
type ref struct {
	id   int
	guid string // "" for an ID
}

func (r ref) String() string {
	if r.guid != "" {
		return "GUID " + r.guid
	}
	return fmt.Sprintf("ID %d", r.id)
}

// parsePrefix reads the magic byte and schema identity at the start of b
// and returns the rest.
func parsePrefix(b []byte) (ref, []byte, error) {
	switch {
	case len(b) >= 5 && b[0] == magicID:
		return ref{id: int(binary.BigEndian.Uint32(b[1:5]))}, b[5:], nil
	case len(b) >= 17 && b[0] == magicGUID:
		return ref{guid: formatGUID(b[1:17])}, b[17:], nil
	case len(b) > 0 && b[0] == magicGUID:
		return ref{}, nil, fmt.Errorf("%w: magic byte 1 (schema GUID) with %d bytes, fewer than the 17 of its prefix", errNotWire, len(b))
	case len(b) > 0 && b[0] == magicID:
		return ref{}, nil, fmt.Errorf("%w: magic byte 0 with %d bytes, fewer than the 5 of its prefix", errNotWire, len(b))
	case len(b) == 0:
		return ref{}, nil, fmt.Errorf("%w: empty", errNotWire)
	}
	return ref{}, nil, fmt.Errorf("%w: first byte 0x%02x is no magic byte (0 or 1)", errNotWire, b[0])
}

// formatGUID writes a GUID in its canonical text form, as the registry's
// /schemas/guids/{guid} takes it.
func formatGUID(b []byte) string {
	var s [36]byte
	hex.Encode(s[0:8], b[0:4])
	s[8] = '-'
	hex.Encode(s[9:13], b[4:6])
	s[13] = '-'
	hex.Encode(s[14:18], b[6:8])
	s[18] = '-'
	hex.Encode(s[19:23], b[8:10])
	s[23] = '-'
	hex.Encode(s[24:36], b[10:16])
	return string(s[:])
}

// parseIndexes reads Protobuf message indexes at the start of b and
// returns them and the rest.
func parseIndexes(b []byte) ([]int, []byte, error) {
	n, k := binary.Varint(b)
	switch {
	case k <= 0:
		return nil, nil, errors.New("message indexes: truncated varint")
	case n == 0:
		return []int{0}, b[k:], nil
	case n < 0 || n > maxIndexes:
		return nil, nil, fmt.Errorf("message indexes: count %d out of range 0 to %d", n, maxIndexes)
	}
	b = b[k:]
	idx := make([]int, n)
	for i := range idx {
		v, k := binary.Varint(b)
		if k <= 0 {
			return nil, nil, errors.New("message indexes: truncated varint")
		}
		if v < 0 || v > 1<<20 {
			return nil, nil, fmt.Errorf("message indexes: index %d out of range", v)
		}
		idx[i] = int(v)
		b = b[k:]
	}
	return idx, b, nil
}

// appendPrefix appends the wire-format prefix of schema id.
func appendPrefix(b []byte, id int) []byte {
	return binary.BigEndian.AppendUint32(append(b, magicID), uint32(id))
}

// appendIndexes appends Protobuf message indexes; [0] is written as the
// lone 0 the serializers write.
func appendIndexes(b []byte, idx []int) []byte {
	if len(idx) == 1 && idx[0] == 0 {
		return append(b, 0)
	}
	b = binary.AppendVarint(b, int64(len(idx)))
	for _, i := range idx {
		b = binary.AppendVarint(b, int64(i))
	}
	return b
}
