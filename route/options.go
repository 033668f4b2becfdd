package route

import (
	"github.com/kpar/kpar/forward"
)

// Opt configures New.
type Opt interface{ apply(*cfg) }

type opt func(*cfg)

func (o opt) apply(c *cfg) { o(c) }

type cfg struct {
	filter      string
	decoder     forward.Decoder
	contentType string
}

func defaultCfg() cfg {
	return cfg{contentType: forward.DefaultContentType}
}

// Filter makes only the records for which expr is true go on to the rules
// (or the fallback); the others are filtered. Default: none, every record
// goes on.
func Filter(expr string) Opt { return opt(func(c *cfg) { c.filter = expr }) }

// Decoder decodes the value and key that the expressions read (typically
// through a schema registry), as the forward.Handler given forward.Decode
// would; the result is handed on with forward.WithDecoded. Default: none,
// value is the record's bytes, parsed when its content type says JSON.
func Decoder(d forward.Decoder) Opt { return opt(func(c *cfg) { c.decoder = d }) }

// ContentType is the content type of records without a content-type header
// of their own, as forward.ContentType: when it says JSON
// (application/json, or a +json type), value is the parsed JSON. Default
// forward.DefaultContentType (application/octet-stream: value is bytes).
func ContentType(mediaType string) Opt { return opt(func(c *cfg) { c.contentType = mediaType }) }
