package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/schema"
)

// addDLQRegistryFlag defines kpar dlq list's --schema-registry.
func addDLQRegistryFlag(fs *flagSet) *string {
	return fs.String("schema-registry", "", "show each dead letter's value decoded to JSON by the Schema Registry at `URL`, as kpar forward would send it (a bearer token from "+envRegistryToken+"; text output only)")
}

// dlqDecoder returns the function that prints a letter's decoded value
// under it and reports whether it did; a value not in the wire format is
// left to writeDLQValue. Without a registry URL it prints nothing.
func dlqDecoder(url string) (func(ctx context.Context, w io.Writer, l deadletter.Letter) bool, error) {
	if url == "" {
		return func(context.Context, io.Writer, deadletter.Letter) bool { return false }, nil
	}
	var opts []schema.Opt
	if tok := os.Getenv(envRegistryToken); tok != "" {
		opts = append(opts, schema.BearerToken(tok))
	}
	reg, err := schema.New(url, opts...)
	if err != nil {
		return nil, err
	}
	dec := schema.NewDecoder(reg, schema.Raw)
	return func(ctx context.Context, w io.Writer, l deadletter.Letter) bool {
		const indent = "    "
		if l.Record == nil || l.Record.Value == nil {
			return false
		}
		d, err := dec.Decode(ctx, l.Record)
		if err != nil {
			fmt.Fprintf(w, "%svalue: not decoded: %s\n", indent, excerpt(err.Error()))
			return false
		}
		if d.ValueForm == forward.FormRaw {
			return false
		}
		var b bytes.Buffer
		if json.Indent(&b, d.Value, indent+"  ", "  ") != nil {
			b.Reset()
			b.Write(d.Value)
		}
		fmt.Fprintf(w, "%svalue (%s, schema ID %d):\n%s  %s\n", indent, d.ValueForm, d.ValueSchemaID, indent, dlqCutString(b.String(), dlqValueMax))
		if d.Key != nil {
			fmt.Fprintf(w, "%skey (%s, schema ID %d): %s\n", indent, d.KeyForm, d.KeySchemaID, dlqCutString(string(d.Key), dlqValueMax))
		}
		return true
	}, nil
}
