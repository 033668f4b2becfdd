package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/kpar/kpar/deadletter"
	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/schema"
)

// addDLQRegistryFlag defines kpar dlq list's --schema-registry.
func addDLQRegistryFlag(fs *flagSet) *string {
	return fs.String("schema-registry", "", "show each dead letter's value decoded to JSON by the Schema Registry at `URL` (credentials as for kpar forward: --schema-registry-user is not needed when "+envRegistryToken+" is set), on an indented line after it (text output only)")
}

// dlqDecoder returns the function that prints a letter's decoded value
// ("  value: {...}") after its line; a no-op without a registry URL.
func dlqDecoder(url string) (func(ctx context.Context, w io.Writer, l deadletter.Letter), error) {
	if url == "" {
		return func(context.Context, io.Writer, deadletter.Letter) {}, nil
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
	return func(ctx context.Context, w io.Writer, l deadletter.Letter) {
		if l.Record == nil || l.Record.Value == nil {
			return
		}
		d, err := dec.Decode(ctx, l.Record)
		if err != nil {
			fmt.Fprintf(w, "  value: (not decoded: %v)\n", err)
			return
		}
		if d.ValueForm == forward.FormRaw {
			fmt.Fprintf(w, "  value: (not in the wire format) %q\n", excerpt(string(d.Value)))
			return
		}
		fmt.Fprintf(w, "  value: %s\n", d.Value)
		if d.Key != nil {
			fmt.Fprintf(w, "  key: %s\n", d.Key)
		}
	}, nil
}
