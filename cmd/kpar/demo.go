package main

import (
	"context"
	"fmt"
	"io"
)

// cmdDemo is a placeholder until the command lands.
func cmdDemo(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "kpar demo: not implemented yet")
	return 1
}
