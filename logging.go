package kpar

import (
	"log/slog"

	"github.com/kpar/kpar/internal/kgolog"
)

// kgoLogger routes franz-go's logs to the Consumer's slog.Logger, thinning
// warnings that repeat.
func kgoLogger(l *slog.Logger) kgolog.Logger { return kgolog.New(l) }
