package schema

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/kpar/kpar/forward"
)

// compiled is a registered schema made ready to decode with.
type compiled struct {
	id   int
	form forward.Form
	avro avro.Schema
	file protoreflect.FileDescriptor
	json *jsonschema.Schema // the JSON Schema validator; nil when jsonErr
	// jsonErr is why a JSON Schema did not compile as a validator (a
	// draft the validator does not know): an error only when validating.
	jsonErr error
}

// compile parses s, whose references refs come dependencies first.
func compile(id int, s sr.Schema, refs []reference) (*compiled, error) {
	c := &compiled{id: id}
	switch s.Type {
	case sr.TypeAvro:
		c.form = forward.FormAvro
		cache := &avro.SchemaCache{}
		for _, rf := range refs {
			if rf.schema.Type != sr.TypeAvro {
				return nil, fmt.Errorf("reference %s is %s, not Avro", rf.name, rf.schema.Type)
			}
			if _, err := avro.ParseWithCache(rf.schema.Schema, "", cache); err != nil {
				return nil, fmt.Errorf("reference %s: %w", rf.name, err)
			}
		}
		a, err := avro.ParseWithCache(s.Schema, "", cache)
		if err != nil {
			return nil, err
		}
		c.avro = a
	case sr.TypeProtobuf:
		c.form = forward.FormProtobuf
		const main = "kpar/registered.proto"
		files := map[string]string{main: s.Schema}
		for _, rf := range refs {
			files[rf.name] = rf.schema.Schema
		}
		comp := protocompile.Compiler{
			Resolver: protocompile.WithStandardImports(protocompile.ResolverFunc(func(path string) (protocompile.SearchResult, error) {
				text, ok := files[path]
				if !ok {
					return protocompile.SearchResult{}, fmt.Errorf("%s: not among the schema's references", path)
				}
				if fd := serializedFile(text); fd != nil {
					fd.Name = proto.String(path)
					return protocompile.SearchResult{Proto: fd}, nil
				}
				return protocompile.SearchResult{Source: strings.NewReader(text)}, nil
			})),
		}
		fds, err := comp.Compile(context.Background(), main)
		if err != nil {
			return nil, err
		}
		// protobuf-go's own descriptors answer IsList, HasPresence and
		// the like from fields, where protocompile's read them from the
		// descriptor proto on each call: a copy is faster to decode with.
		if c.file, err = nativeFile(fds[0], &protoregistry.Files{}); err != nil {
			return nil, err
		}
	case sr.TypeJSON:
		c.form = forward.FormJSONSchema
		c.json, c.jsonErr = compileJSONSchema(s, refs)
	default:
		return nil, fmt.Errorf("unknown schema type %q", s.Type)
	}
	return c, nil
}

// nativeFile rebuilds f, and the files it imports, as protobuf-go
// descriptors, registering them in reg.
func nativeFile(f protoreflect.FileDescriptor, reg *protoregistry.Files) (protoreflect.FileDescriptor, error) {
	if got, err := reg.FindFileByPath(f.Path()); err == nil {
		return got, nil
	}
	if got, err := protoregistry.GlobalFiles.FindFileByPath(f.Path()); err == nil && f.Package() == "google.protobuf" {
		return got, nil // a well-known type linked into this binary
	}
	imps := f.Imports()
	for i := range imps.Len() {
		if _, err := nativeFile(imps.Get(i).FileDescriptor, reg); err != nil {
			return nil, err
		}
	}
	nf, err := protodesc.NewFile(protodesc.ToFileDescriptorProto(f), resolverWithGlobal{reg})
	if err != nil {
		return nil, err
	}
	if err := reg.RegisterFile(nf); err != nil {
		return nil, err
	}
	return nf, nil
}

// resolverWithGlobal finds files in reg, then among those linked in.
type resolverWithGlobal struct{ reg *protoregistry.Files }

func (r resolverWithGlobal) FindFileByPath(p string) (protoreflect.FileDescriptor, error) {
	if f, err := r.reg.FindFileByPath(p); err == nil {
		return f, nil
	}
	return protoregistry.GlobalFiles.FindFileByPath(p)
}

func (r resolverWithGlobal) FindDescriptorByName(n protoreflect.FullName) (protoreflect.Descriptor, error) {
	if d, err := r.reg.FindDescriptorByName(n); err == nil {
		return d, nil
	}
	return protoregistry.GlobalFiles.FindDescriptorByName(n)
}

// serializedFile reads a Protobuf schema registered as a serialized
// FileDescriptorProto in base64 (Confluent's JavaScript and Go serializers
// register that form; the registry serves it back as it was given), or
// returns nil for schema text.
func serializedFile(text string) *descriptorpb.FileDescriptorProto {
	if strings.ContainsAny(text, " \n\t;{") {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(text)
	if err != nil {
		return nil
	}
	fd := &descriptorpb.FileDescriptorProto{}
	if proto.Unmarshal(b, fd) != nil {
		return nil
	}
	return fd
}

func compileJSONSchema(s sr.Schema, refs []reference) (*jsonschema.Schema, error) {
	comp := jsonschema.NewCompiler()
	for _, rf := range refs {
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(rf.schema.Schema))
		if err != nil {
			return nil, fmt.Errorf("reference %s: %w", rf.name, err)
		}
		if err := comp.AddResource(rf.name, doc); err != nil {
			return nil, fmt.Errorf("reference %s: %w", rf.name, err)
		}
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(s.Schema))
	if err != nil {
		return nil, err
	}
	const main = "kpar-registered.json"
	if err := comp.AddResource(main, doc); err != nil {
		return nil, err
	}
	return comp.Compile(main)
}

// validateJSON checks the JSON v against the JSON Schema.
func (c *compiled) validateJSON(v []byte) error {
	if c.jsonErr != nil {
		return fmt.Errorf("the schema does not compile for validation: %w", c.jsonErr)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(v))
	if err != nil {
		return err
	}
	if err := c.json.Validate(inst); err != nil {
		return fmt.Errorf("does not match its schema: %w", err)
	}
	return nil
}

// message returns the Protobuf message the indexes name.
func (c *compiled) message(idx []int) (protoreflect.MessageDescriptor, error) {
	var md protoreflect.MessageDescriptor
	msgs := c.file.Messages()
	for n, i := range idx {
		if i >= msgs.Len() {
			return nil, fmt.Errorf("message index %v: no message %d at depth %d (%d there)", idx, i, n, msgs.Len())
		}
		md = msgs.Get(i)
		msgs = md.Messages()
	}
	if md == nil {
		return nil, errors.New("no message indexes")
	}
	return md, nil
}

// decode turns payload (after the prefix) into JSON; idx are the
// Protobuf message indexes.
func (c *compiled) decode(payload []byte, idx []int, validate bool) ([]byte, error) {
	switch c.form {
	case forward.FormAvro:
		return avroToJSON(c.avro, payload)
	case forward.FormProtobuf:
		md, err := c.message(idx)
		if err != nil {
			return nil, err
		}
		if fastPath(md) {
			out, err := protoToJSON(md, payload)
			if err != errSlowPath {
				return out, err
			}
		}
		m := dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(payload, m); err != nil {
			return nil, err
		}
		return protojson.Marshal(m)
	default:
		if !json.Valid(payload) {
			return nil, errors.New("not valid JSON")
		}
		if validate {
			if err := c.validateJSON(payload); err != nil {
				return nil, err
			}
		}
		return payload, nil
	}
}
