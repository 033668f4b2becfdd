package route

import (
	"reflect"
	"strings"
	"testing"

	"github.com/google/cel-go/common/types"
)

func TestParseJSONKeepsNumbersExact(t *testing.T) {
	for _, c := range []struct {
		in   string
		want any
	}{
		{`9007199254740993`, int64(9007199254740993)},
		{`-9223372036854775808`, int64(-9223372036854775808)},
		{`18446744073709551615`, uint64(18446744073709551615)},
		{`18446744073709551616`, 18446744073709551616.0},
		{`0.5e-3`, 0.0005},
		{`{"id":123456789012345678,"a":[1,2.5]}`, map[string]any{"id": int64(123456789012345678), "a": []any{int64(1), 2.5}}},
		{`"caf\u00e9"`, "café"},
		{"\t true \n", true},
		{`null`, nil},
	} {
		if got := parseJSON([]byte(c.in), "value"); !reflect.DeepEqual(got, c.want) {
			t.Errorf("parseJSON(%s) = %#v, want %#v", c.in, got, c.want)
		}
	}
}

func TestParseJSONRefusesWhatIsNotOneValue(t *testing.T) {
	for _, in := range []string{``, `{`, `[1,]`, `01`, `1 2`, `{} x`, `tru`, `"abc`} {
		v, ok := parseJSON([]byte(in), "value").(*types.Err)
		if !ok || !strings.Contains(v.String(), "value is not JSON") {
			t.Errorf("parseJSON(%q) = %v, want a 'value is not JSON' error", in, v)
		}
	}
}
