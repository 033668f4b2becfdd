package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kpar/kpar"
)

// defaultMaxBufferedBytes is --max-buffered-bytes' default: the library's
// MaxBufferedBytes default, 64 MiB. It bounds the records fetched and not
// yet finished, those in flight included, so a forwarder's memory does not
// grow with --concurrency times the record size. See docs/operations.md
// ("Memory") for what it costs in resident memory.
const defaultMaxBufferedBytes = 64 << 20

// minMaxBufferedBytes is the least --max-buffered-bytes taken: below it the
// fetches sized from the bound (an eighth of it) are too small to be worth
// their round trips.
const minMaxBufferedBytes = 1 << 20

// limitFlags are the memory flags of kpar forward and kpar backfill.
type limitFlags struct {
	maxBuffered byteSize
}

// addLimitFlags defines --max-buffered-bytes on fs.
func addLimitFlags(fs *flagSet) *limitFlags {
	l := &limitFlags{maxBuffered: defaultMaxBufferedBytes}
	fs.Var(&l.maxBuffered, "max-buffered-bytes", "bound the key, value and header bytes of the records fetched and not yet finished (in flight included) to `SIZE` (bytes, or with KiB, MiB, GiB, KB, MB, GB); a record is admitted only below the bound (so it is exceeded by one record at most) and fetching pauses, so memory does not grow with --concurrency x record size")
	return l
}

// check returns the usage error of a bound too small to work with.
func (l *limitFlags) check(fs *flagSet) (code int, ok bool) {
	if l.maxBuffered < minMaxBufferedBytes {
		return fs.usageError("invalid --max-buffered-bytes %s: want 1MiB or more", l.maxBuffered), false
	}
	return 0, true
}

// opts are the kpar options the flags set.
func (l *limitFlags) opts() []kpar.FlowOpt {
	return []kpar.FlowOpt{kpar.MaxBufferedBytes(int64(l.maxBuffered))}
}

// attrs are the start-up log line's attributes of the flags.
func (l *limitFlags) attrs() []any { return []any{"max_buffered_bytes", l.maxBuffered.String()} }

// byteSize is a flag value in bytes, given as a number with an optional
// unit: KiB, MiB, GiB (powers of 1024) or KB, MB, GB (powers of 1000),
// case-insensitive.
type byteSize int64

var byteUnits = []struct {
	suffix string
	scale  int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"b", 1},
}

func (b *byteSize) Set(s string) error {
	v := strings.ToLower(strings.TrimSpace(s))
	scale := int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(v, u.suffix) {
			v, scale = strings.TrimSpace(strings.TrimSuffix(v, u.suffix)), u.scale
			break
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	switch {
	case err != nil:
		return errors.New("want a whole number of bytes, optionally with KiB, MiB, GiB, KB, MB or GB (256MiB)")
	case n < 0 || n > (1<<62)/scale:
		return errors.New("out of range")
	}
	*b = byteSize(n * scale)
	return nil
}

// String is the size in the largest binary unit that divides it.
func (b byteSize) String() string {
	for _, u := range []struct {
		name  string
		scale int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && int64(b)%u.scale == 0 {
			return fmt.Sprintf("%d%s", int64(b)/u.scale, u.name)
		}
	}
	return strconv.FormatInt(int64(b), 10)
}
