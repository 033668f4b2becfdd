// Serializes records with Confluent's own JavaScript serializers
// (@confluentinc/schemaregistry) for kpar's interop test
// (cmd/kpar/typed_interop_test.go), and deserializes them back with
// Confluent's deserializers, so that the test can check what kpar sent
// the endpoint against what Node reads from the same bytes.
//
//   node serialize.js PLAN.json OUT.json
//
// PLAN: {"registry": URL, "fileDescriptorSet": base64 (Protobuf files),
//        "cases": [{"name", "kind": "avro"|"protobuf"|"json", "topic",
//                   "schema" (Avro or JSON Schema text; registered first
//                   when given), "type" (Protobuf message), "value"}]}
// OUT:  [{"name", "topic", "bytes": base64, "node": deserialized value}]
// In values and in "node", a Buffer is {"$bytes": base64}; in "node" a
// bigint is a string.
'use strict';
const fs = require('fs');
const {
  SchemaRegistryClient, SerdeType,
  AvroSerializer, AvroDeserializer,
  ProtobufSerializer, ProtobufDeserializer,
  JsonSerializer, JsonDeserializer,
} = require('@confluentinc/schemaregistry');
const { createFileRegistry, fromBinary, fromJson, toJson } = require('@bufbuild/protobuf');
const { FileDescriptorSetSchema } = require('@bufbuild/protobuf/wkt');

function plain(v) {
  if (Buffer.isBuffer(v) || v instanceof Uint8Array) return { $bytes: Buffer.from(v).toString('base64') };
  if (typeof v === 'bigint') return v.toString();
  if (v instanceof Date) return v.toISOString();
  if (Array.isArray(v)) return v.map(plain);
  if (v && typeof v === 'object') {
    const o = {};
    for (const [k, x] of Object.entries(v)) if (k !== '$typeName' && k !== '$unknown') o[k] = plain(x);
    return o;
  }
  return v;
}

// fromPlain is plain's inverse, for the values of the plan.
function fromPlain(v) {
  if (Array.isArray(v)) return v.map(fromPlain);
  if (v && typeof v === 'object') {
    if (typeof v.$bytes === 'string') return Buffer.from(v.$bytes, 'base64');
    const o = {};
    for (const [k, x] of Object.entries(v)) o[k] = fromPlain(x);
    return o;
  }
  return v;
}

async function main() {
  const [planFile, outFile] = process.argv.slice(2);
  const plan = JSON.parse(fs.readFileSync(planFile, 'utf8'));
  const registry = plan.fileDescriptorSet
    ? createFileRegistry(fromBinary(FileDescriptorSetSchema, Buffer.from(plan.fileDescriptorSet, 'base64')))
    : undefined;
  const out = [];
  for (const c of plan.cases) {
    // A client per case: a client caches a subject's latest version.
    const client = new SchemaRegistryClient({ baseURLs: [plan.registry] });
    const subject = c.topic + '-value';
    let ser, de, value = fromPlain(c.value);
    switch (c.kind) {
      case 'avro':
        if (c.schema) await client.register(subject, { schemaType: 'AVRO', schema: c.schema });
        ser = new AvroSerializer(client, SerdeType.VALUE, { useLatestVersion: true });
        de = new AvroDeserializer(client, SerdeType.VALUE, {});
        break;
      case 'json':
        if (c.schema) await client.register(subject, { schemaType: 'JSON', schema: c.schema });
        ser = new JsonSerializer(client, SerdeType.VALUE, { useLatestVersion: true });
        de = new JsonDeserializer(client, SerdeType.VALUE, {});
        break;
      case 'protobuf': {
        ser = new ProtobufSerializer(client, SerdeType.VALUE, { autoRegisterSchemas: true, registry });
        de = new ProtobufDeserializer(client, SerdeType.VALUE, {});
        value = fromJson(registry.getMessage(c.type), c.value, { registry });
        break;
      }
      default:
        throw new Error('unknown kind ' + c.kind);
    }
    const bytes = await ser.serialize(c.topic, value);
    let node;
    try {
      const back = await de.deserialize(c.topic, bytes);
      node = c.kind === 'protobuf' ? toJson(registry.getMessage(c.type), back, { registry }) : plain(back);
    } catch (e) {
      node = { $error: String(e && e.message || e) };
    }
    out.push({ name: c.name, topic: c.topic, bytes: bytes.toString('base64'), node });
  }
  fs.writeFileSync(outFile, JSON.stringify(out));
}

main().catch((e) => { console.error(e); process.exit(1); });
