// What amqplib allocates per publish for the headers table, by the shape of the headers
// object the caller passes (target 12: what reaches V8's old space per message). amqplib's
// `Args.publish` makes the headers an `Object.create` of the caller's object and
// `encodeTable` walks the result with `for…in`; this measures V8's heap spaces around 20,000
// such calls with a young generation large enough that no scavenge runs in between.
//
//   node --expose-gc --min-semi-space-size=128 --max-semi-space-size=128 --import tsx \
//     experiments/amqplib-headers-alloc.ts [literal|allKeys|nullPrototype|frozen|none] [args|encode]
import { createRequire } from 'node:module';
import { getHeapSpaceStatistics } from 'node:v8';

type Headers = Record<string, unknown> | undefined;

// amqplib's internals, read here only to measure them; Courier never calls them.
const require = createRequire(import.meta.url);
const lib = `${require.resolve('amqplib').replace(/channel_api\.js$/, '')}lib/`;
const Args = require(`${lib}api_args.js`) as { publish(exchange: string, routingKey: string, options: object): { headers: object } };
const codec = require(`${lib}codec.js`) as { encodeTable(buffer: Buffer, table: object, offset: number): number };

const assigned = (headers: Record<string, unknown>, i: number): Record<string, unknown> => {
  headers['tenant'] = 'acme';
  headers['courier-occurred-at'] = '2026-12-01T00:00:00.000Z';
  headers['courier-version'] = 1;
  headers['courier-topic'] = 'orders';
  headers['courier-key'] = `k${i}`;
  headers['courier-traceparent'] = '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01';
  return headers;
};
const SHAPES: Readonly<Record<string, (i: number) => Headers>> = {
  // What toAmqpMessage builds: an empty literal, then one assignment per header.
  literal: (i) => assigned({}, i),
  allKeys: (i) => ({
    tenant: 'acme',
    'courier-occurred-at': '2026-12-01T00:00:00.000Z',
    'courier-version': 1,
    'courier-topic': 'orders',
    'courier-key': `k${i}`,
    'courier-traceparent': '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01',
  }),
  nullPrototype: (i) => assigned(Object.create(null) as Record<string, unknown>, i),
  frozen: (i) => Object.freeze(assigned({}, i)),
  none: () => undefined,
};

const shape = process.argv[2] ?? 'literal';
const encode = process.argv[3] === 'encode';
const make = SHAPES[shape];
if (make === undefined) throw new Error(`unknown shape '${shape}'; one of ${Object.keys(SHAPES).join(', ')}`);
const gc = (globalThis as { gc?: () => void }).gc;
if (gc === undefined) throw new Error('run with node --expose-gc');
const CALLS = 20_000;
const buffer = Buffer.alloc(65_536);
const spaces = (): Map<string, number> => new Map(getHeapSpaceStatistics().map((space) => [space.space_name, space.space_used_size]));

function run(): Map<string, number> {
  gc!();
  const before = spaces();
  for (let i = 0; i < CALLS; i++) {
    const fields = Args.publish('x', 'orders', { mandatory: true, messageId: 'm', deliveryMode: 2, headers: make!(i) });
    if (encode) codec.encodeTable(buffer, fields.headers, 0);
  }
  const after = spaces();
  return new Map([...after].map(([name, used]) => [name, (used - (before.get(name) ?? 0)) / CALLS]));
}

for (let warm = 0; warm < 5; warm++) run();
const perCall = [...run()].filter(([, bytes]) => bytes !== 0).map(([name, bytes]) => `${name} ${bytes.toFixed(0)} B`);
console.log(`${shape}, headers built + Args.publish${encode ? ' + encodeTable' : ''}: ${perCall.join(', ') || 'nothing'} per call`);
