// Writes one Avro order, serialized by Confluent's serializer with a schema
// it registers, to stdout: the README's typed quick start.
//
//   node order.js http://127.0.0.1:8081 orders > order.bin
'use strict';
const { SchemaRegistryClient, SerdeType, AvroSerializer } = require('@confluentinc/schemaregistry');

const schema = {
  type: 'record', name: 'Order', namespace: 'shop',
  fields: [
    { name: 'id', type: 'long' },
    { name: 'amount', type: { type: 'bytes', logicalType: 'decimal', precision: 9, scale: 2 } },
    { name: 'status', type: { type: 'enum', name: 'Status', symbols: ['NEW', 'PAID'] } },
    { name: 'note', type: ['null', 'string'], default: null },
  ],
};

async function main() {
  const [url = 'http://127.0.0.1:8081', topic = 'orders'] = process.argv.slice(2);
  const client = new SchemaRegistryClient({ baseURLs: [url] });
  await client.register(topic + '-value', { schemaType: 'AVRO', schema: JSON.stringify(schema) });
  const ser = new AvroSerializer(client, SerdeType.VALUE, { useLatestVersion: true });
  // 42.50 is 4250 hundredths, big-endian two's complement.
  const bytes = await ser.serialize(topic, { id: 1, amount: Buffer.from([0x10, 0x9a]), status: 'PAID', note: 'gift wrap' });
  process.stdout.write(bytes);
}

main().catch((e) => { console.error(e); process.exit(1); });
