// Package offsetmeta encodes the finished offsets above a committed offset
// into the metadata string of an OffsetCommit, and decodes them back.
//
// A partition's committed offset is the lowest unfinished record; records
// above it that already finished would be handled again after a crash or a
// rebalance. The metadata carries them, so the next owner skips them.
//
// The metadata also names the ordering mode of the member that committed
// (version 2), so that a member of another mode can refuse the partition
// before it handles a record: the group protocol of Kafka 4 (KIP-848)
// carries no client metadata in which members could compare modes.
//
// Format, version 2: the text "kpar2:" followed by the unpadded URL-safe
// base64 of a binary body, so that tools printing metadata as a string
// (kafka-consumer-groups, kcat) show ASCII. The body is
//
//	byte    mode          the committer's ordering mode: any byte but 0
//	uvarint base          the committed offset the set belongs to
//	byte    encoding      'r' (runs), 'b' (bitset) or 'n' (none: no
//	                      finished offset above base)
//	runs:   uvarint count, then per run: uvarint gap, uvarint length
//	        (the first run starts gap offsets after base+1, each next one
//	        gap offsets after the end of the previous; length >= 1, and
//	        every gap after the first >= 1 so runs never touch)
//	bitset: uvarint length in bytes, then the bits: bit i (LSB first) set
//	        means offset base+1+i is finished; the last byte is non-zero
//
// Version 1 ("kpar1:") is the same body without the mode byte, and never
// 'n': kpar before version 2 wrote it, and Decode still reads it (its mode
// is unknown, 0).
//
// Encode picks the smaller encoding. A set that does not fit in the cap is
// cut to the longest prefix of runs that fits: what is left out is simply
// handled again, it never stalls a commit.
//
// Decoding is strict: anything that is not a well-formed body for that base (another client's metadata, a truncated string, a future
// version, a different base, non-shortest varints, touching runs) is an
// error, and the caller treats an error as "nothing is known to be
// finished".
package offsetmeta

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
)

// Prefix starts every metadata string Encode writes (version 2).
const Prefix = "kpar2:"

// prefixV1 starts the version 1 strings of older kpar releases.
const prefixV1 = "kpar1:"

// MaxBytes is Kafka's default offset.metadata.max.bytes: brokers reject a
// longer metadata string with OFFSET_METADATA_TOO_LARGE.
const MaxBytes = 4096

// Run is a half-open range [From, To) of finished offsets.
type Run struct{ From, To int64 }

// Len is the number of offsets in r.
func (r Run) Len() int64 { return r.To - r.From }

const (
	encRuns   = 'r'
	encBitset = 'b'
	encNone   = 'n'
)

// maxRuns bounds what Decode accepts, so garbage cannot make it allocate
// much: a 4 KiB string holds fewer runs than this.
const maxRuns = MaxBytes

// Encode returns the metadata of a commit at base by a member of ordering
// mode (not 0), with the finished runs above base, cut to fit in limit
// bytes (at most MaxBytes is what brokers accept by default), and how many
// runs it covers. runs must be sorted, not touching, and above base:
// From > base. With no runs, the metadata names the mode alone. With a
// limit too small for that, Encode returns "" and 0: a plain commit.
func Encode(mode byte, base int64, runs []Run, limit int) (meta string, covered int) {
	// The body may use 3/4 of what is left after the prefix (base64).
	bodyMax := (limit - len(Prefix)) * 3 / 4
	head := 1 + uvarintLen(uint64(base)) + 1
	if bodyMax < head {
		return "", 0
	}
	if len(runs) == 0 {
		return encodeNone(mode, base), 0
	}

	// The longest prefix of runs that fits, in each encoding.
	nRuns, sizeRuns := 0, head
	countMax := uvarintLen(uint64(len(runs)))
	prevEnd := base + 1
	for i, r := range runs {
		n := uvarintLen(uint64(r.From-prevEnd)) + uvarintLen(uint64(r.Len()))
		if sizeRuns+countMax+n > bodyMax {
			break
		}
		sizeRuns += n
		nRuns, prevEnd = i+1, r.To
	}
	sizeRuns += uvarintLen(uint64(nRuns))

	nBits := 0
	for nBits < len(runs) && head+bitsetLen(base, runs[nBits])+2 <= bodyMax {
		nBits++
	}
	sizeBits := head
	if nBits > 0 {
		sizeBits += bitsetLen(base, runs[nBits-1])
		sizeBits += uvarintLen(uint64(sizeBits))
		for sizeBits > bodyMax { // the length prefix pushed it over
			nBits--
			sizeBits = head
			if nBits > 0 {
				n := bitsetLen(base, runs[nBits-1])
				sizeBits += n + uvarintLen(uint64(n))
			}
		}
	}

	useBits := nBits > nRuns || (nBits == nRuns && sizeBits < sizeRuns)
	n := nRuns
	if useBits {
		n = nBits
	}
	if n == 0 {
		return encodeNone(mode, base), 0
	}
	body := make([]byte, 0, max(sizeRuns, sizeBits))
	body = append(body, mode)
	body = binary.AppendUvarint(body, uint64(base))
	if useBits {
		body = append(body, encBitset)
		body = appendBitset(body, base, runs[:n])
	} else {
		body = append(body, encRuns)
		body = binary.AppendUvarint(body, uint64(n))
		prevEnd = base + 1
		for _, r := range runs[:n] {
			body = binary.AppendUvarint(body, uint64(r.From-prevEnd))
			body = binary.AppendUvarint(body, uint64(r.Len()))
			prevEnd = r.To
		}
	}
	return Prefix + base64.RawURLEncoding.EncodeToString(body), n
}

// encodeNone is the metadata of a commit with no finished offset above base.
func encodeNone(mode byte, base int64) string {
	body := append([]byte{mode}, binary.AppendUvarint(nil, uint64(base))...)
	return Prefix + base64.RawURLEncoding.EncodeToString(append(body, encNone))
}

// bitsetLen is the bytes a bitset needs to reach the end of r.
func bitsetLen(base int64, r Run) int {
	bits := r.To - base - 1
	if bits > 8*MaxBytes {
		return math.MaxInt32
	}
	return int((bits + 7) / 8)
}

func appendBitset(dst []byte, base int64, runs []Run) []byte {
	n := bitsetLen(base, runs[len(runs)-1])
	dst = binary.AppendUvarint(dst, uint64(n))
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	bits := dst[start:]
	for _, r := range runs {
		for o := r.From; o < r.To; o++ {
			i := o - base - 1
			bits[i/8] |= 1 << (i % 8)
		}
	}
	return dst
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// ErrNotKpar is returned by Decode for metadata that kpar did not write
// (empty, another client's, or a future version of this format).
var ErrNotKpar = errors.New("offsetmeta: not kpar metadata")

// Decode returns the ordering mode that meta names (0 for version 1, which
// names none) and the finished runs it records above base, the committed
// offset it was read with. With an error, nothing is known to be finished:
// the caller handles every record from base on; the mode may still be known
// (Mode reads it alone).
func Decode(meta string, base int64) (mode byte, runs []Run, err error) {
	body, v2, err := payload(meta)
	if err != nil {
		return 0, nil, err
	}
	if base < 0 {
		return 0, nil, fmt.Errorf("offsetmeta: negative base %d", base)
	}
	r := reader{b: body}
	if v2 {
		if mode = r.byte(); r.err == nil && mode == 0 {
			r.fail("mode 0")
		}
	}
	got := r.uvarint()
	if r.err == nil && got != uint64(base) {
		return mode, nil, fmt.Errorf("offsetmeta: written for offset %d, read with committed offset %d", got, base)
	}
	enc := r.byte()
	switch {
	case r.err != nil:
	case enc == encRuns:
		runs = r.runs(base)
	case enc == encBitset:
		runs = r.bitset(base)
	case enc == encNone && v2:
		if len(r.b) > 0 {
			r.fail("%d trailing bytes", len(r.b))
		}
		return mode, nil, r.err
	default:
		r.fail("unknown encoding %q", enc)
	}
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d trailing bytes", len(r.b))
	}
	if r.err == nil && len(runs) == 0 {
		r.fail("no runs")
	}
	if r.err != nil {
		return 0, nil, r.err
	}
	return mode, runs, nil
}

// Mode returns the ordering mode that meta names, and false when it names
// none (another client's metadata, version 1, a damaged string).
func Mode(meta string) (byte, bool) {
	body, v2, err := payload(meta)
	if err != nil || !v2 || len(body) == 0 || body[0] == 0 {
		return 0, false
	}
	return body[0], true
}

// payload returns the binary body of meta and whether it is version 2.
func payload(meta string) ([]byte, bool, error) {
	rest, v2 := strings.CutPrefix(meta, Prefix)
	if !v2 {
		var ok bool
		if rest, ok = strings.CutPrefix(meta, prefixV1); !ok {
			return nil, false, ErrNotKpar
		}
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	if err != nil {
		return nil, false, fmt.Errorf("offsetmeta: bad base64: %w", err)
	}
	return b, v2, nil
}

type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("offsetmeta: "+format, args...)
	}
}

// uvarint reads a canonical (shortest-form) uvarint.
func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 || n != uvarintLen(v) {
		r.fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) == 0 {
		r.fail("truncated")
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) runs(base int64) []Run {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n == 0 || n > maxRuns || n > uint64(len(r.b)) {
		r.fail("bad run count %d", n)
		return nil
	}
	runs := make([]Run, 0, n)
	prevEnd := base + 1
	for i := range n {
		gap, length := r.uvarint(), r.uvarint()
		if r.err != nil {
			return nil
		}
		if (i > 0 && gap == 0) || length == 0 {
			r.fail("run %d: gap %d, length %d", i, gap, length)
			return nil
		}
		if gap > math.MaxInt64-uint64(prevEnd) || length > math.MaxInt64-uint64(prevEnd)-gap {
			r.fail("run %d overflows", i)
			return nil
		}
		from := prevEnd + int64(gap)
		runs = append(runs, Run{from, from + int64(length)})
		prevEnd = from + int64(length)
	}
	return runs
}

func (r *reader) bitset(base int64) []Run {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n == 0 || n > MaxBytes || n != uint64(len(r.b)) {
		r.fail("bitset of %d bytes, %d present", n, len(r.b))
		return nil
	}
	bits := r.b
	r.b = nil
	if bits[len(bits)-1] == 0 {
		r.fail("bitset ends in a zero byte")
		return nil
	}
	var runs []Run
	for i := range int64(len(bits)) * 8 {
		if bits[i/8]&(1<<(i%8)) == 0 {
			continue
		}
		o := base + 1 + i
		if n := len(runs); n > 0 && runs[n-1].To == o {
			runs[n-1].To++
		} else {
			runs = append(runs, Run{o, o + 1})
		}
	}
	return runs
}
