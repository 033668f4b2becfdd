package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/kpar/kpar"
	"github.com/kpar/kpar/forward"
	"github.com/kpar/kpar/schema"
)

// typedFlags are the flags of typed records (kpar forward, kpar backfill):
// a Schema Registry decodes Confluent wire-format values to JSON before
// they are sent (the schema module; docs/http-contract.md, "Typed
// records").
type typedFlags struct {
	registry     *string
	user         *string
	passwordFile *string
	tokenFile    *string
	ca           *string
	validate     *bool
	undecodable  *string
	replySchema  *string // nil where there are no replies
	// decoder is set by opts with --schema-registry: the filter and the
	// routes (route.Decoder) read the record it decodes.
	decoder forward.Decoder
	// offline (--check-config) keeps opts from asking the registry.
	offline bool
}

// The registry's secrets come from these variables or from files, never
// from a flag alone (a flag shows in the process list).
const (
	envRegistryPassword = "KPAR_SCHEMA_REGISTRY_PASSWORD"
	envRegistryToken    = "KPAR_SCHEMA_REGISTRY_TOKEN"
)

func addTypedFlags(fs *flagSet, replies bool) *typedFlags {
	tf := &typedFlags{
		registry:     fs.String("schema-registry", "", "decode Confluent wire-format values (and keys) with the Schema Registry at `URL`: Avro, Protobuf and JSON Schema become a JSON body (docs/http-contract.md, typed records)"),
		user:         fs.String("schema-registry-user", "", "basic-auth `USER` of the registry (an API key); its password comes from "+envRegistryPassword+" or --schema-registry-password-file"),
		passwordFile: fs.String("schema-registry-password-file", "", "read the registry's basic-auth password from `FILE`"),
		tokenFile:    fs.String("schema-registry-token-file", "", "read a bearer token for the registry from `FILE` (or give "+envRegistryToken+")"),
		ca:           fs.String("schema-registry-ca", "", "verify an https registry against the PEM CA certificates in `FILE`"),
		validate:     fs.Bool("schema-validate", false, "validate JSON Schema values against their schema (default: sent as written)"),
		undecodable:  fs.String("undecodable", "dead-letter", "what becomes of a value not in the wire format, `MODE`: dead-letter, or raw (sent as it is)"),
	}
	if replies {
		tf.replySchema = fs.String("reply-schema", "", "with --reply-topic, encode each JSON reply with `SUBJECT[:VERSION]`'s schema (default the latest) in the wire format; a reply that does not fit dead-letters its input")
	}
	return tf
}

// opts returns the forward options of the flags (none without
// --schema-registry), and the attributes for the start line.
func (tf *typedFlags) opts(ctx context.Context, fs *flagSet, log *slog.Logger, replyTopic string) (opts []forward.Opt, attrs []any, code int, ok bool) {
	if strings.TrimSpace(*tf.registry) == "" {
		for _, name := range []string{"schema-registry-user", "schema-registry-password-file", "schema-registry-token-file", "schema-registry-ca", "schema-validate", "undecodable", "reply-schema"} {
			if fs.Lookup(name) != nil && fs.given(name) {
				return nil, nil, fs.usageError("invalid --%s: it needs --schema-registry", name), false
			}
		}
		return nil, nil, 0, true
	}
	var u schema.Undecodable
	switch *tf.undecodable {
	case "dead-letter":
		u = schema.DeadLetter
	case "raw":
		u = schema.Raw
	default:
		return nil, nil, fs.usageError("invalid --undecodable %q: want dead-letter or raw", *tf.undecodable), false
	}
	reg, code, ok := tf.newRegistry(fs)
	if !ok {
		return nil, nil, code, false
	}
	attrs = []any{"schema_registry", reg.URL(), "undecodable", *tf.undecodable}
	// An unreachable registry at start is not fatal: records wait for it
	// as for an endpoint that is down.
	if tf.offline {
		// --check-config: the registry is not asked.
	} else if err := reg.Check(ctx); err != nil && ctx.Err() == nil {
		log.Warn("the schema registry does not answer yet; records wait for it", "schema_registry", reg.URL(), "err", err)
	}
	tf.decoder = schema.NewDecoder(reg, u)
	opts = []forward.Opt{forward.Decode(tf.decoder)}
	enc, code, ok := tf.replyEncoder(ctx, fs, log, reg, replyTopic)
	if !ok {
		return nil, nil, code, false
	}
	if enc != nil {
		opts = append(opts, forward.EncodeReplies(enc))
		attrs = append(attrs, "reply_schema", *tf.replySchema)
	}
	return opts, attrs, 0, true
}

// newRegistry is the client of --schema-registry, with its credentials,
// CA and --schema-validate.
func (tf *typedFlags) newRegistry(fs *flagSet) (*schema.Registry, int, bool) {
	var ropts []schema.Opt
	password, err := secret(os.Getenv(envRegistryPassword), *tf.passwordFile)
	if err != nil {
		return nil, fs.usageError("invalid --schema-registry-password-file: %v", err), false
	}
	token, err := secret(os.Getenv(envRegistryToken), *tf.tokenFile)
	if err != nil {
		return nil, fs.usageError("invalid --schema-registry-token-file: %v", err), false
	}
	switch {
	case *tf.user != "" && token != "":
		return nil, fs.usageError("invalid --schema-registry-user with a bearer token: give one way to authenticate"), false
	case *tf.user == "" && password != "":
		return nil, fs.usageError("a registry password (%s or --schema-registry-password-file) needs --schema-registry-user", envRegistryPassword), false
	case *tf.user != "":
		ropts = append(ropts, schema.BasicAuth(*tf.user, password))
	case token != "":
		ropts = append(ropts, schema.BearerToken(token))
	}
	if *tf.ca != "" {
		pool, err := readCAs(*tf.ca)
		if err != nil {
			return nil, fs.usageError("invalid --schema-registry-ca: %v", err), false
		}
		ropts = append(ropts, schema.TLSConfig(&tls.Config{RootCAs: pool}))
	}
	if *tf.validate {
		ropts = append(ropts, schema.Validate())
	}
	reg, err := schema.New(strings.TrimSpace(*tf.registry), ropts...)
	if err != nil {
		return nil, fs.usageError("invalid --schema-registry: %v", err), false
	}
	return reg, 0, true
}

// replyEncoder is the encoder of --reply-schema (nil without it). A
// registry that does not answer yet makes a lazy one: replies wait for
// it.
func (tf *typedFlags) replyEncoder(ctx context.Context, fs *flagSet, log *slog.Logger, reg *schema.Registry, replyTopic string) (*schema.ReplyEncoder, int, bool) {
	if tf.replySchema == nil || *tf.replySchema == "" {
		return nil, 0, true
	}
	if replyTopic == "" {
		return nil, fs.usageError("invalid --reply-schema: it needs --reply-topic"), false
	}
	subject, version, err := schema.ParseSubject(*tf.replySchema)
	if err != nil {
		return nil, fs.usageError("invalid --reply-schema: %v", err), false
	}
	var enc *schema.ReplyEncoder
	if tf.offline {
		enc = schema.LazyReplyEncoder(reg, subject, version)
	} else {
		enc, err = schema.NewReplyEncoder(ctx, reg, subject, version)
	}
	switch {
	case kpar.IsPermanent(err):
		return nil, fs.usageError("invalid --reply-schema %q: %v", *tf.replySchema, err), false
	case err != nil && ctx.Err() == nil:
		log.Warn("the reply schema could not be fetched yet; replies wait for the registry", "reply_schema", *tf.replySchema, "err", err)
		enc = schema.LazyReplyEncoder(reg, subject, version)
	}
	return enc, 0, true
}

// secret is env, else the trimmed content of file ("" for none); a file
// wins over the variable.
func secret(env, file string) (string, error) {
	if file == "" {
		return env, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", file)
	}
	return s, nil
}
