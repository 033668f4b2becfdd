package forward

import "time"

// appendTimestamp appends t in TimestampLayout, in UTC: what
// t.UTC().AppendFormat(b, TimestampLayout) appends, without parsing the
// layout for every record. A year outside 0-9999, which the fixed-width
// form cannot hold, goes through AppendFormat.
func appendTimestamp(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, TimestampLayout)
	}
	hour, min, sec := t.Clock()
	ms := t.Nanosecond() / int(time.Millisecond)
	b = append4(b, year)
	b = append(b, '-')
	b = append2(b, int(month))
	b = append(b, '-')
	b = append2(b, day)
	b = append(b, 'T')
	b = append2(b, hour)
	b = append(b, ':')
	b = append2(b, min)
	b = append(b, ':')
	b = append2(b, sec)
	b = append(b, '.', byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10), 'Z')
	return b
}

// append2 and append4 append n (0-99, 0-9999) zero-padded.
func append2(b []byte, n int) []byte { return append(b, byte('0'+n/10), byte('0'+n%10)) }

func append4(b []byte, n int) []byte {
	return append(b, byte('0'+n/1000), byte('0'+n/100%10), byte('0'+n/10%10), byte('0'+n%10))
}
