// A NATS-protocol-aware hop between a client and the fixture's TcpProxy, for the fixture's
// `failSettles`: it reads the client's frames and sends the chosen settles to a subject no
// stream or consumer listens on, so the server itself answers them "503 no responders" — what
// a client sees when JetStream cannot take the write — and the settle fails there, at the
// broker, with no seam in the transport. Everything else passes byte for byte.
import { connect, createServer, type Server, type Socket } from 'node:net';

/** The settles `failSettles` can make fail (`TransportFixture.failSettles`). */
export type SettleKind = 'ack' | 'retry' | 'deadLetter';

/**
 * How many of the next settles of each kind to refuse, for the connections of one fixture
 * (streams and subjects named after `prefix`).
 *
 * Guarantees: a settle is counted when its frame passes, so `count` settles of a kind fail,
 * whichever connection of the fixture sends them. What counts as one: `ack`, a consumer
 * acknowledgement (`+ACK` on `$JS.ACK.<prefix>_MSG.…`, in-progress signals and naks pass);
 * `retry`, a publish to a consumer's retry subject `<prefix>.c.…` (replays publish there too);
 * `deadLetter`, a publish to `<prefix>.dlq.…`.
 */
export class SettleFaults {
  readonly #prefix: string;
  readonly #pending: Record<SettleKind, number> = { ack: 0, retry: 0, deadLetter: 0 };

  constructor(prefix: string) {
    this.#prefix = prefix;
  }

  /** Refuses the next `count` settles of `kind` (added to any still pending). */
  fail(kind: SettleKind, count: number): void {
    this.#pending[kind] += count;
  }

  /** The subject to send a client's publish to `subject` with `payload` on: its own, or a dead end when it is a settle to refuse. */
  route(subject: string, payload: Buffer): string {
    const kind = this.#kindOf(subject, payload);
    if (kind === undefined || this.#pending[kind] === 0) return subject;
    this.#pending[kind] -= 1;
    // No stream captures `<prefix>.refused.>`: the server answers the request with 503.
    return `${this.#prefix}.refused.${kind}`;
  }

  #kindOf(subject: string, payload: Buffer): SettleKind | undefined {
    if (subject.startsWith(`$JS.ACK.${this.#prefix}_MSG.`) && payload.toString('latin1') === '+ACK') return 'ack';
    if (subject.startsWith(`${this.#prefix}.c.`)) return 'retry';
    if (subject.startsWith(`${this.#prefix}.dlq.`)) return 'deadLetter';
    return undefined;
  }
}

/**
 * A loopback hop to `127.0.0.1:targetPort` that routes each client `PUB`/`HPUB` through
 * `faults`; the server's side passes untouched. A connection whose other side closes is
 * closed too, so the fixture's `kill` and `outage` (on the TcpProxy behind it) reach the client.
 */
export class SettleFaultProxy {
  readonly #server: Server;
  readonly #sockets = new Set<Socket>();

  private constructor(targetPort: number, faults: SettleFaults) {
    this.#server = createServer((client) => {
      const upstream = connect(targetPort, '127.0.0.1');
      for (const socket of [client, upstream]) {
        this.#sockets.add(socket);
        socket.on('close', () => {
          this.#sockets.delete(socket);
          client.destroy();
          upstream.destroy();
        });
        socket.on('error', () => socket.destroy());
      }
      upstream.pipe(client);
      let pending: Buffer = Buffer.alloc(0);
      client.on('data', (chunk: Buffer) => {
        pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
        pending = forwardFrames(pending, faults, (bytes) => upstream.write(bytes));
      });
    });
  }

  /** A hop listening on a free loopback port, forwarding to `127.0.0.1:targetPort`. */
  static async start(targetPort: number, faults: SettleFaults): Promise<SettleFaultProxy> {
    const proxy = new SettleFaultProxy(targetPort, faults);
    await new Promise<void>((resolve, reject) => proxy.#server.once('error', reject).listen(0, '127.0.0.1', resolve));
    return proxy;
  }

  /** The loopback port clients connect to. */
  get port(): number {
    const address = this.#server.address();
    if (address === null || typeof address === 'string') throw new Error('settle fault proxy is not listening');
    return address.port;
  }

  /** Stops listening and cuts every connection. */
  async close(): Promise<void> {
    for (const socket of this.#sockets) socket.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

/**
 * Writes every complete client frame of `buffer` through `write`, a `PUB`/`HPUB` with the
 * subject `faults` routes it to; returns the incomplete rest. Client frames are one line
 * (`CONNECT`, `SUB`, `PING`, …) or a line and a body whose size ends the line.
 */
function forwardFrames(buffer: Buffer, faults: SettleFaults, write: (bytes: Buffer) => void): Buffer {
  let rest = buffer;
  for (;;) {
    const eol = rest.indexOf('\r\n');
    if (eol < 0) return rest;
    const line = rest.subarray(0, eol).toString('latin1');
    const [op = '', ...args] = line.split(/[ \t]+/);
    const withBody = op.toUpperCase() === 'PUB' || op.toUpperCase() === 'HPUB';
    if (!withBody) {
      write(rest.subarray(0, eol + 2));
      rest = rest.subarray(eol + 2);
      continue;
    }
    const total = Number(args[args.length - 1]);
    const end = eol + 2 + total + 2;
    if (rest.length < end) return rest;
    const headerBytes = op.toUpperCase() === 'HPUB' ? Number(args[args.length - 2]) : 0;
    const body = rest.subarray(eol + 2, eol + 2 + total);
    const subject = args[0] ?? '';
    const routed = faults.route(subject, body.subarray(headerBytes));
    write(routed === subject ? rest.subarray(0, eol + 2) : Buffer.from(`${[op, routed, ...args.slice(1)].join(' ')}\r\n`, 'latin1'));
    write(rest.subarray(eol + 2, end));
    rest = rest.subarray(end);
  }
}
