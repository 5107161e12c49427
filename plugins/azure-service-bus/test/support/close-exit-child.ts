// Child process of close-exit.test.ts: a process that publishes through a ServiceBusTransport,
// loses its connection (the parent black-holes it), gives its client up, closes the transport
// and then has nothing left to do. It prints when close() resolved; the parent measures how
// long the process still lives after that (the test's question: does a given-up client's
// abandoned close keep a process that has finished alive?).
import { ServiceBusClient } from '@azure/service-bus';
import { makeEnvelope } from '@courier/conformance';
import { ServiceBusTransport } from '../../src/index.js';
import { standInConnectionString } from './standin-server.js';

const port = Number(process.env['CLOSE_EXIT_PORT']);
const say = (line: string) => process.stdout.write(`${line}\n`);
// The parent's go-ahead is a signal: a listener does not keep the process alive (stdin would).
const signalled = () => new Promise<void>((resolve) => process.once('SIGUSR2', () => resolve()));

const transport = new ServiceBusTransport({
  client: () => new ServiceBusClient(standInConnectionString(port), { retryOptions: { maxRetries: 0, timeoutInMs: 60_000 } }),
  prefix: `${process.env['CLOSE_EXIT_PREFIX']}.`,
  publishTimeoutMs: 1_000,
  logger: { debug: () => undefined, info: () => undefined, warn: (message, meta) => say(`warn ${message} ${JSON.stringify(meta)}`), error: () => undefined },
});
const first = await transport.publish([makeEnvelope({ topic: 'orders.placed', key: null })]);
const go = signalled();
say(`published ${first[0]?.ok}`);
await go;
// The connection is black-holed: this send gets no answer, times out, and the client (which
// answered before) is given up at once; its close hangs on the dead connection.
const second = await transport.publish([makeEnvelope({ topic: 'orders.placed', key: null })]).catch((error: unknown) => [{ ok: false, error }]);
say(`second ${second[0]?.ok} ${String((second[0] as { error?: { code?: string } }).error?.code)}`);
const started = Date.now();
await transport.close();
say(`closed ${Date.now() - started}`);
