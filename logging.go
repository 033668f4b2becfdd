package kpar

import "github.com/kpar/kpar/internal/kgolog"

// kgoLogger routes franz-go's logs to the Consumer's slog.Logger.
type kgoLogger = kgolog.Logger
