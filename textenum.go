package kpar

import (
	"fmt"
	"slices"
	"strings"
)

// The text forms of kpar's small enumerations (Order, Protocol): one name
// per value, for flags (flag.TextVar) and configuration files.

// enumString is v's name, or typ(v) for a value without one.
func enumString[T ~int](names []string, v T, typ string) string {
	if v >= 0 && int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, int(v))
}

// enumMarshal is v's name, and an error for a value without one.
func enumMarshal[T ~int](names []string, v T, typ string) ([]byte, error) {
	if v < 0 || int(v) >= len(names) {
		return nil, fmt.Errorf("kpar: unknown %s", enumString(names, v, typ))
	}
	return []byte(names[v]), nil
}

// enumParse is the value named b; what names the kind of value for the
// error, which lists the names.
func enumParse[T ~int](names []string, b []byte, what string) (T, error) {
	if i := slices.Index(names, string(b)); i >= 0 {
		return T(i), nil
	}
	return 0, fmt.Errorf("kpar: unknown %s %q: use %s", what, b, strings.Join(names, ", "))
}
