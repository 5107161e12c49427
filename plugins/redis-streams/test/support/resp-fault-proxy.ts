// A RESP-aware hop between the transport's clients and the TcpProxy to Redis, so the fixture
// can make Redis itself seem to refuse chosen commands: an XADD of a message the test wants
// refused (rejectPublish, refusable) or the script of a settle (failSettles) is answered with
// an error reply, as Redis answers a command it refuses, and never forwarded. Redis cannot
// refuse an entry for its content (its only content limit, `proto-max-bulk-len`, is global to
// a server other tests share), so the refusal is the proxy's, through the same reply path.
// Replies keep the order of the commands: a local error waits for the replies of the commands
// forwarded before it.
import { createServer, connect, type Server, type Socket } from 'node:net';
import type { Envelope } from '@courier/core';
import { ACK_SCRIPT, DEAD_SCRIPT, RETRY_SCRIPT } from '../../src/stream-scripts.js';

type SettleKind = 'ack' | 'retry' | 'deadLetter';

/** What the proxies of one fixture refuse (shared by all of them). */
export class RespFaults {
  readonly #settles = new Map<SettleKind, number>();
  refuse: ((envelope: Envelope) => boolean) | undefined;

  fail(kind: SettleKind, count: number): void {
    this.#settles.set(kind, (this.#settles.get(kind) ?? 0) + count);
  }

  /** The error reply for a command to refuse, or undefined to forward it. */
  verdict(args: readonly Buffer[]): string | undefined {
    const name = args[0]?.toString('latin1').toUpperCase();
    if (name === 'XADD' && args[1]?.toString().includes(':topic:')) {
      const envelope = envelopeOf(args);
      if (envelope && (envelope.headers['x-fixture-refuse'] !== undefined || this.refuse?.(envelope))) return '-ERR courier fixture: this entry is refused\r\n';
    }
    if (name === 'EVAL') {
      const script = args[1]?.toString();
      const kind: SettleKind | undefined = script === ACK_SCRIPT ? 'ack' : script === RETRY_SCRIPT ? 'retry' : script === DEAD_SCRIPT ? 'deadLetter' : undefined;
      const left = kind === undefined ? 0 : (this.#settles.get(kind) ?? 0);
      if (kind !== undefined && left > 0) {
        this.#settles.set(kind, left - 1);
        return `-ERR courier fixture: the ${kind} settle fails\r\n`;
      }
    }
    return undefined;
  }
}

function envelopeOf(args: readonly Buffer[]): Envelope | undefined {
  for (let index = 2; index + 1 < args.length; index += 1) {
    if (args[index]!.toString() !== 'envelope') continue;
    try {
      return JSON.parse(args[index + 1]!.toString()) as Envelope;
    } catch {
      return undefined;
    }
  }
  return undefined;
}

const CRLF = Buffer.from('\r\n');

/** End offset of the RESP value at `pos`, or -1 when it is not complete yet. */
function skipValue(buffer: Buffer, pos: number): number {
  if (pos >= buffer.length) return -1;
  const lineEnd = buffer.indexOf(CRLF, pos);
  if (lineEnd < 0) return -1;
  const type = String.fromCharCode(buffer[pos]!);
  const n = Number(buffer.toString('latin1', pos + 1, lineEnd));
  switch (type) {
    case '$':
    case '!':
    case '=': {
      if (n < 0) return lineEnd + 2;
      const end = lineEnd + 2 + n + 2;
      return end <= buffer.length ? end : -1;
    }
    case '*':
    case '~':
    case '>':
    case '%':
    case '|': {
      if (n < 0) return lineEnd + 2;
      let next = lineEnd + 2;
      for (let count = type === '%' || type === '|' ? 2 * n : n; count > 0; count -= 1) {
        next = skipValue(buffer, next);
        if (next < 0) return -1;
      }
      return next;
    }
    default:
      return lineEnd + 2;
  }
}

/** The bulk-string arguments of the command array at `pos` (it must be complete). */
function commandArgs(buffer: Buffer, pos: number): Buffer[] {
  const args: Buffer[] = [];
  let lineEnd = buffer.indexOf(CRLF, pos);
  const count = Number(buffer.toString('latin1', pos + 1, lineEnd));
  let next = lineEnd + 2;
  for (let index = 0; index < count; index += 1) {
    lineEnd = buffer.indexOf(CRLF, next);
    const length = Number(buffer.toString('latin1', next + 1, lineEnd));
    args.push(buffer.subarray(lineEnd + 2, lineEnd + 2 + length));
    next = lineEnd + 2 + length + 2;
  }
  return args;
}

/** The proxy: listens on a port of its own and forwards to `upstreamPort` (the TcpProxy). */
export class RespFaultProxy {
  readonly #server: Server;
  readonly #sockets: Set<Socket>;

  private constructor(server: Server, sockets: Set<Socket>) {
    this.#server = server;
    this.#sockets = sockets;
  }

  static async start(upstreamPort: number, faults: RespFaults): Promise<RespFaultProxy> {
    const sockets = new Set<Socket>();
    const server = createServer((client) => {
      const upstream = connect(upstreamPort, '127.0.0.1');
      sockets.add(client).add(upstream);
      // One entry per command in flight: null for a forwarded one, else the local reply.
      const replies: (string | null)[] = [];
      let fromClient = Buffer.alloc(0);
      let fromServer = Buffer.alloc(0);
      const flushLocal = () => {
        while (replies.length > 0 && replies[0] !== null) client.write(replies.shift()!);
      };
      client.on('data', (chunk) => {
        fromClient = Buffer.concat([fromClient, chunk]);
        let pos = 0;
        for (let end = skipValue(fromClient, pos); end >= 0; end = skipValue(fromClient, pos)) {
          const verdict = faults.verdict(commandArgs(fromClient, pos));
          if (verdict === undefined) {
            replies.push(null);
            upstream.write(fromClient.subarray(pos, end));
          } else {
            replies.push(verdict);
            flushLocal();
          }
          pos = end;
        }
        fromClient = fromClient.subarray(pos);
      });
      upstream.on('data', (chunk) => {
        fromServer = Buffer.concat([fromServer, chunk]);
        let pos = 0;
        for (let end = skipValue(fromServer, pos); end >= 0; end = skipValue(fromServer, pos)) {
          flushLocal();
          replies.shift();
          client.write(fromServer.subarray(pos, end));
          flushLocal();
          pos = end;
        }
        fromServer = fromServer.subarray(pos);
      });
      const end = () => {
        client.destroy();
        upstream.destroy();
        sockets.delete(client);
        sockets.delete(upstream);
      };
      for (const socket of [client, upstream]) {
        socket.on('error', end);
        socket.on('close', end);
      }
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    return new RespFaultProxy(server, sockets);
  }

  get port(): number {
    const address = this.#server.address();
    if (address === null || typeof address === 'string') throw new Error('resp fault proxy is not listening');
    return address.port;
  }

  async close(): Promise<void> {
    for (const socket of this.#sockets) socket.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}
