package main

import (
	"context"
	"fmt"
	"io"
)

// cmdBench is a placeholder until the command lands.
func cmdBench(_ context.Context, _ []string, _, stderr io.Writer) int {
	fmt.Fprintln(stderr, "kpar bench: not implemented yet")
	return 1
}
