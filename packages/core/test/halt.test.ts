import { describe, expect, it } from 'vitest';
import {
  ConfigError,
  InMemoryBroker,
  TransportError,
  InMemoryDatabase,
  InMemoryInboxStore,
  InMemoryOutboxStore,
  UnrecoverableError,
  createBus,
  defineMessage,
  newMessageId,
  type Envelope,
  type InMemoryTransaction,
  type InboxStore,
  type Transport,
} from '@courier/core';
import { eventually } from './support/harness.js';

const Moved = defineMessage('ledger.Moved', { version: 1 });

function envelope(messageId: string, key: string | null): Envelope {
  return {
    messageId,
    type: Moved.type,
    version: 1,
    topic: Moved.topic,
    occurredAt: new Date().toISOString(),
    key,
    correlationId: messageId,
    causationId: null,
    traceparent: null,
    tracestate: null,
    headers: {},
    payload: '{}',
  };
}

/** A bus with one ordered `halt` subscription whose handler fails for the messages in `broken`, recording applied ids in commit order. */
async function haltBus(options: { maxAttempts?: number; retryDelayMs?: number; leaseMs?: number; loseAckOf?: Set<string> } = {}) {
  const database = new InMemoryDatabase();
  const broker = new InMemoryBroker();
  const connection = broker.connect();
  const inbox = new InMemoryInboxStore({ database });
  const lose = options.loseAckOf;
  // The first ack of a message in `loseAckOf` fails as a dropped connection would: the
  // broker redelivers it, after the consumer's work (here: halting the key) committed.
  const transport: Transport = lose
    ? {
        capabilities: connection.capabilities,
        deadLetters: connection.deadLetters,
        publish: (messages, publishOptions) => connection.publish(messages, publishOptions),
        close: () => connection.close(),
        subscribe: (endpoint, handler) =>
          connection.subscribe(endpoint, (delivery) =>
            handler({
              envelope: delivery.envelope,
              attempt: delivery.attempt,
              redelivered: delivery.redelivered,
              ...(delivery.replayed !== undefined ? { replayed: delivery.replayed } : {}),
              ack: async () => {
                if (lose.delete(delivery.envelope.messageId)) throw new TransportError('connection lost before the ack');
                return delivery.ack();
              },
              retry: (delayMs, reason) => delivery.retry(delayMs, reason),
              deadLetter: (reason) => delivery.deadLetter(reason),
            }),
          ),
      }
    : connection;
  const bus = createBus({
    outbox: new InMemoryOutboxStore({ database }),
    inbox,
    transport,
    relay: { pollIntervalMs: 20, pause: { initialDelayMs: 10, maxDelayMs: 20 }, ...(options.leaseMs ? { leaseMs: options.leaseMs } : {}) },
  });
  const broken = new Set<string>();
  const failing = new Set<string>();
  const applied: string[] = [];
  const runs: string[] = [];
  bus.subscribe(
    'ledger',
    Moved,
    async (message, context) => {
      runs.push(message.messageId);
      if (broken.has(message.messageId)) throw new UnrecoverableError(`broken ${message.messageId}`);
      if (failing.has(message.messageId)) throw new Error(`failing ${message.messageId}`);
      context.tx.onCommit(() => applied.push(message.messageId));
    },
    { ordered: true, poison: 'halt', retry: { maxAttempts: options.maxAttempts ?? 2, initialDelayMs: options.retryDelayMs ?? 1, maxDelayMs: options.retryDelayMs ?? 1, jitter: 0 } },
  );
  await bus.start();
  const ids = (prefix: string, count: number) => Array.from({ length: count }, (_, i) => `${prefix}-${i + 1}-${newMessageId()}`);
  return {
    bus,
    inbox,
    connection,
    broken,
    failing,
    applied,
    runs,
    ids,
    publish: (key: string | null, messageIds: readonly string[]) => connection.publish(messageIds.map((id) => envelope(id, key))),
    async [Symbol.asyncDispose]() {
      await bus.stop();
      await broker.close();
    },
  };
}

describe("poison 'halt' for ordered subscriptions: configuration", () => {
  const database = new InMemoryDatabase();
  const transport = new InMemoryBroker().connect();

  it("is refused on an unordered subscription, naming the fix", () => {
    const bus = createBus({ outbox: new InMemoryOutboxStore({ database }), inbox: new InMemoryInboxStore({ database }), transport });
    expect(() => bus.subscribe('c', Moved, async () => {}, { poison: 'halt' })).toThrow(/ordered subscriptions only/);
    expect(() => bus.subscribe('d', Moved, async () => {}, { poison: 'bury' as 'park' })).toThrow(ConfigError);
  });

  it('is refused when the inbox store has no halts, naming the capability', () => {
    const full = new InMemoryInboxStore({ database });
    // An inbox store with only the base members (as a store without the capability is).
    const bare: InboxStore<InMemoryTransaction> = {
      run: (id, consumer, work, options) => full.run(id, consumer, work, options),
      recordStart: (id, consumer) => full.recordStart(id, consumer),
      forget: (id, consumer) => full.forget(id, consumer),
      prune: (ms) => full.prune(ms),
    };
    const bus = createBus({ outbox: new InMemoryOutboxStore({ database }), inbox: bare, transport });
    expect(() => bus.subscribe('c', Moved, async () => {}, { ordered: true, poison: 'halt' })).toThrow(/InboxHalts/);
    // 'park' (the default) needs nothing.
    expect(() => bus.subscribe('c', Moved, async () => {}, { ordered: true, poison: 'park' })).not.toThrow();
  });
});

describe("poison 'halt' for ordered subscriptions: behaviour", () => {
  it('halts the key at a poison head: later messages of the key are held, not applied, while other keys flow', async () => {
    await using h = await haltBus();
    const [a1, a2, a3] = h.ids('a', 3) as [string, string, string];
    const [b1] = h.ids('b', 1) as [string];
    h.broken.add(a1);
    await h.publish('a', [a1, a2, a3]);
    await h.publish('b', [b1]);
    await eventually(async () => expect((await h.inbox.listHalted({ consumer: 'ledger' }))[0]?.held).toBe(2));
    await eventually(() => expect(h.applied).toEqual([b1]));
    const [halt] = await h.inbox.listHalted({ consumer: 'ledger' });
    expect(halt).toMatchObject({ consumer: 'ledger', topic: Moved.topic, key: 'a', resumed: null, held: 2 });
    expect(halt!.head!.envelope.messageId).toBe(a1);
    expect(halt!.head!.error).toContain('broken');
    // Nothing of the key was dead-lettered or applied, and a2, a3 never ran.
    expect(await h.connection.deadLetters.list('ledger')).toEqual([]);
    expect(h.runs.filter((id) => id === a2 || id === a3)).toEqual([]);
    expect(h.bus.health().counters.deadLettered).toBe(0);
    expect(h.bus.health().counters.haltedKeys).toBe(1);
    // A message of the key arriving later is held too.
    const [a4] = h.ids('a4', 1) as [string];
    await h.publish('a', [a4]);
    await eventually(async () => expect((await h.inbox.listHalted())[0]?.held).toBe(3));
    expect(h.applied).toEqual([b1]);
  });

  it("resume 'retry': the head runs again, then the held messages in order, once each; the halt is lifted", async () => {
    await using h = await haltBus();
    const [a1, a2, a3] = h.ids('a', 3) as [string, string, string];
    h.broken.add(a1);
    await h.publish('a', [a1, a2, a3]);
    await eventually(async () => expect((await h.inbox.listHalted())[0]?.held).toBe(2));
    h.broken.delete(a1);
    expect(await h.inbox.resumeHalted('ledger', Moved.topic, 'a', 'retry')).toBe(1);
    // A second resume of the same halt changes nothing.
    expect(await h.inbox.resumeHalted('ledger', Moved.topic, 'a', 'retry')).toBe(0);
    await eventually(() => expect(h.applied).toEqual([a1, a2, a3]));
    await eventually(async () => expect(await h.inbox.listHalted()).toEqual([]));
    // After the lift the key flows live again.
    const [a4] = h.ids('a4', 1) as [string];
    await h.publish('a', [a4]);
    await eventually(() => expect(h.applied).toEqual([a1, a2, a3, a4]));
    expect(await h.inbox.listParked()).toEqual([]);
  });

  it("resume 'park': the head is parked (listed, recorded dead), the held messages are applied in order; a later copy of the head is a duplicate", async () => {
    await using h = await haltBus();
    const [a1, a2, a3] = h.ids('a', 3) as [string, string, string];
    h.broken.add(a1);
    await h.publish('a', [a1, a2, a3]);
    await eventually(async () => expect((await h.inbox.listHalted())[0]?.held).toBe(2));
    expect(await h.inbox.resumeHalted('ledger', Moved.topic, 'a', 'park')).toBe(1);
    await eventually(() => expect(h.applied).toEqual([a2, a3]));
    await eventually(async () => expect(await h.inbox.listHalted()).toEqual([]));
    const parked = await h.inbox.listParked({ consumer: 'ledger' });
    expect(parked.map((entry) => entry.envelope.messageId)).toEqual([a1]);
    expect(parked[0]!.error).toContain('broken');
    const runsOfHead = h.runs.filter((id) => id === a1).length;
    await h.publish('a', [a1]);
    await eventually(() => expect(h.bus.health().counters.duplicates).toBeGreaterThanOrEqual(1));
    expect(h.runs.filter((id) => id === a1).length).toBe(runsOfHead);
  });

  it('a held message that fails while draining halts the key again, at that message, counted once per re-halt that took effect; a retry resume then finishes the key', async () => {
    await using h = await haltBus();
    const [a1, a2, a3] = h.ids('a', 3) as [string, string, string];
    h.broken.add(a1);
    h.broken.add(a2);
    await h.publish('a', [a1, a2, a3]);
    await eventually(async () => expect((await h.inbox.listHalted())[0]?.held).toBe(2));
    expect(h.bus.health().counters.haltedKeys).toBe(1);
    h.broken.delete(a1);
    const haltedAtA2 = async () => expect((await h.inbox.listHalted())[0]).toMatchObject({ resumed: null, held: 1, head: { envelope: { messageId: a2 } } });
    await h.inbox.resumeHalted('ledger', Moved.topic, 'a', 'retry');
    await eventually(haltedAtA2);
    expect(h.applied).toEqual([a1]);
    // Halted at a1, halted again at a2 while draining: two halts an operator had to see.
    expect(h.bus.health().counters.haltedKeys).toBe(2);
    // The next drain loses its claim just before it would halt the key again: the store
    // refuses that re-halt (once), nothing is counted for it, and the drain that follows
    // halts the key for real, counted once.
    const rehalt = h.inbox.rehalt.bind(h.inbox);
    let refused = 0;
    h.inbox.rehalt = async (...args) => {
      if (refused > 0) return rehalt(...args);
      refused += 1;
      return false;
    };
    await h.inbox.resumeHalted('ledger', Moved.topic, 'a', 'retry');
    await eventually(async () => {
      expect(refused).toBe(1);
      await haltedAtA2();
    });
    expect(h.bus.health().counters.haltedKeys).toBe(3);
    expect(h.applied).toEqual([a1]);
    h.broken.delete(a2);
    await h.inbox.resumeHalted('ledger', Moved.topic, 'a', 'retry');
    await eventually(() => expect(h.applied).toEqual([a1, a2, a3]));
    await eventually(async () => expect(await h.inbox.listHalted()).toEqual([]));
  });

  it('attempts exhausted halt the key as poison does; a message without a key is dead-lettered as under park', async () => {
    await using h = await haltBus({ maxAttempts: 2 });
    const [a1, a2] = h.ids('a', 2) as [string, string];
    const [n1] = h.ids('n', 1) as [string];
    // A plain Error (retriable) fails both attempts.
    h.failing.add(a1);
    h.broken.add(n1);
    await h.publish('a', [a1, a2]);
    await h.publish(null, [n1]);
    await eventually(async () => expect((await h.inbox.listHalted())[0]?.held).toBe(1));
    const [halt] = await h.inbox.listHalted();
    expect(halt!.head!.error).toMatch(/ATTEMPTS_EXHAUSTED: 2 attempts/);
    expect(h.runs.filter((id) => id === a1)).toHaveLength(2);
    await eventually(async () => expect((await h.connection.deadLetters.list('ledger')).map((letter) => letter.envelope.messageId)).toEqual([n1]));
  });
});

describe("poison 'halt': the drain's claim", () => {
  // Issue 29: the drain's lease was renewed only by its steps, not while one step ran. A
  // head retrying in place for longer than the lease lost the claim: its re-halt was fenced
  // out, the key stayed resumed 'retry', was claimed and run again for ever, and the
  // consumer's other resumed keys never drained.
  it('is renewed while a resumed head retries in place for longer than the lease: the head halts the key again, and the next resumed key drains', async () => {
    const leaseMs = 1_500;
    // Four backoffs of 1 s: the head's retries outlast the lease more than twice over.
    await using h = await haltBus({ maxAttempts: 5, retryDelayMs: 1_000, leaseMs });
    const [a1] = h.ids('a', 1) as [string];
    const [b1] = h.ids('b', 1) as [string];
    h.broken.add(a1);
    h.broken.add(b1);
    await h.publish('a', [a1]);
    await eventually(async () => expect(await h.inbox.listHalted()).toHaveLength(1));
    await h.publish('b', [b1]);
    await eventually(async () => expect(await h.inbox.listHalted()).toHaveLength(2));
    // a1 now fails every try (retried in place); b1 is fixed.
    h.broken.delete(a1);
    h.failing.add(a1);
    h.broken.delete(b1);
    expect(await h.inbox.resumeHalted('ledger', Moved.topic, 'a', 'retry')).toBe(1);
    expect(await h.inbox.resumeHalted('ledger', Moved.topic, 'b', 'retry')).toBe(1);
    await eventually(async () => {
      const halts = await h.inbox.listHalted();
      expect(halts.map((halt) => [halt.key, halt.resumed, halt.head?.envelope.messageId])).toEqual([['a', null, a1]]);
      expect(halts[0]!.head!.error).toMatch(/ATTEMPTS_EXHAUSTED: 5 attempts/);
    }, 20_000);
    expect(h.applied).toEqual([b1]);
    // The drain ran the head's five attempts once: no second drainer ran it meanwhile.
    expect(h.runs.filter((id) => id === a1)).toHaveLength(1 + 5);
  });
});

describe("poison 'halt': a lost ack after the halt committed", () => {
  it('the head redelivered behind its own halt is held, and applied once when the key is resumed', async () => {
    const lose = new Set<string>();
    await using h = await haltBus({ loseAckOf: lose });
    const [a1, a2] = h.ids('a', 2) as [string, string];
    h.broken.add(a1);
    lose.add(a1);
    await h.publish('a', [a1, a2]);
    // The head's ack after halting was lost: its redelivery meets the halt it made.
    await eventually(async () => expect(lose.size).toBe(0));
    await eventually(async () => expect((await h.inbox.listHalted())[0]?.held).toBe(2));
    const [halt] = await h.inbox.listHalted();
    expect(halt!.head!.envelope.messageId).toBe(a1);
    h.broken.delete(a1);
    await h.inbox.resumeHalted('ledger', Moved.topic, 'a', 'retry');
    await eventually(() => expect(h.applied).toEqual([a1, a2]));
    await eventually(async () => expect(await h.inbox.listHalted()).toEqual([]));
    expect(h.applied).toEqual([a1, a2]);
  });

  it('keeps the key whole under kills: a head that kills every process running it is halted as CRASH_LOOP (not dead-lettered), the rest of its key held, then applied in order on resume', async () => {
    // Issue 15's run: a healthy message dead-lettered as CRASH_LOOP after kills from outside,
    // and the later messages of its key applied after it — a gap. Under 'halt' the key
    // stops whole instead. A "process" here is a bus on its own connection; it dies as a
    // SIGKILL would: its connection killed (its deliveries go back, flagged redelivered),
    // its bus abandoned with the handler still running (no settle, no count cleared).
    const database = new InMemoryDatabase();
    const broker = new InMemoryBroker();
    const inbox = new InMemoryInboxStore({ database });
    const outbox = new InMemoryOutboxStore({ database });
    const producer = broker.connect();
    const applied: string[] = [];
    const killing = { on: true };
    const [a1, a2, a3] = Array.from({ length: 3 }, (_, i) => `a${i + 1}-${newMessageId()}`) as [string, string, string];
    const [b1] = [`b1-${newMessageId()}`];
    let processes = 0;
    const live: { bus: ReturnType<typeof createBus<InMemoryTransaction>>; connection: Transport }[] = [];
    const start = async (): Promise<void> => {
      processes += 1;
      const connection = broker.connect();
      const bus = createBus({ outbox, inbox, transport: connection, relay: { pollIntervalMs: 20, pause: { initialDelayMs: 10, maxDelayMs: 20 } } });
      const self = { bus, connection };
      bus.subscribe(
        'ledger',
        Moved,
        async (message, context) => {
          if (killing.on && message.messageId === a1) {
            // The process dies with a1 in hand; a fresh one starts.
            live.splice(live.indexOf(self), 1);
            broker.kill(connection);
            void bus.stop({ timeoutMs: 0 }).catch(() => undefined);
            setTimeout(() => void start(), 5);
            return new Promise<never>(() => {});
          }
          context.tx.onCommit(() => applied.push(message.messageId));
        },
        { ordered: true, poison: 'halt', maxCrashes: 2, retry: { maxAttempts: 3, initialDelayMs: 1, maxDelayMs: 1 } },
      );
      live.push(self);
      await bus.start();
    };
    try {
      await start();
      await producer.publish([envelope(a1, 'a'), envelope(a2, 'a'), envelope(b1, 'b'), envelope(a3, 'a')]);
      const halts = await eventually(async () => {
        const listed = await inbox.listHalted({ consumer: 'ledger' });
        expect(listed[0]?.held, 'key a halted with a2 and a3 held').toBe(2);
        return listed;
      });
      expect(halts[0]!.head!.envelope.messageId).toBe(a1);
      expect(halts[0]!.head!.error).toContain('CRASH_LOOP');
      // Killed once as a first delivery, then maxCrashes - 1 times alone, then halted.
      expect(processes).toBeGreaterThanOrEqual(2);
      await eventually(() => expect(applied).toContain(b1));
      expect(applied.filter((id) => id.startsWith('a')), 'nothing of the halted key is applied: no gap').toEqual([]);
      expect(await producer.deadLetters!.list('ledger'), 'nothing went to the transport dead letters').toEqual([]);

      killing.on = false;
      expect(await inbox.resumeHalted('ledger', Moved.topic, 'a', 'retry')).toBe(1);
      await eventually(() => expect(applied.filter((id) => id.startsWith('a'))).toEqual([a1, a2, a3]));
      await eventually(async () => expect(await inbox.listHalted()).toEqual([]));
    } finally {
      killing.on = false;
      await Promise.all(live.map((process) => process.bus.stop({ timeoutMs: 1_000 }).catch(() => undefined)));
      await broker.close();
    }
  });
});

describe("poison 'halt': crash accounting of drained messages", () => {
  // Issue 29: a resumed head that killed its process was run by every new process about
  // every lease, for ever: the drain counted no starts. It must halt the key again after
  // `maxCrashes` deaths, as a delivery that keeps killing its process is given up on.
  it('a resumed head that kills every process draining it halts its key again as CRASH_LOOP after maxCrashes deaths', async () => {
    const database = new InMemoryDatabase();
    const broker = new InMemoryBroker();
    const inbox = new InMemoryInboxStore({ database });
    const outbox = new InMemoryOutboxStore({ database });
    const producer = broker.connect();
    const applied: string[] = [];
    const mode = { head: 'broken' as 'broken' | 'killing' | 'fine' };
    const [a1, a2] = [`a1-${newMessageId()}`, `a2-${newMessageId()}`];
    let processes = 0;
    let deaths = 0;
    const live: ReturnType<typeof createBus<InMemoryTransaction>>[] = [];
    const start = async (): Promise<void> => {
      processes += 1;
      const connection = broker.connect();
      // A short drain lease (relay.leaseMs): a dead drainer's key is claimed again soon.
      const bus = createBus({ outbox, inbox, transport: connection, relay: { pollIntervalMs: 20, leaseMs: 500, pause: { initialDelayMs: 10, maxDelayMs: 20 } } });
      bus.subscribe(
        'ledger',
        Moved,
        async (message, context) => {
          if (message.messageId === a1 && mode.head === 'broken') throw new UnrecoverableError('broken a1');
          if (message.messageId === a1 && mode.head === 'killing') {
            // The process dies with a1 in hand (as SIGKILL: nothing settled or cleared); a fresh one starts.
            deaths += 1;
            live.splice(live.indexOf(bus), 1);
            broker.kill(connection);
            void bus.stop({ timeoutMs: 0 }).catch(() => undefined);
            setTimeout(() => void start(), 5);
            return new Promise<never>(() => {});
          }
          context.tx.onCommit(() => applied.push(message.messageId));
        },
        // A long crash window: a dead "process" here keeps its timers, a real one does not.
        { ordered: true, poison: 'halt', maxCrashes: 2, crashWindowMs: 60_000, retry: { maxAttempts: 2, initialDelayMs: 1, maxDelayMs: 1 } },
      );
      live.push(bus);
      await bus.start();
    };
    try {
      await start();
      await producer.publish([envelope(a1, 'a'), envelope(a2, 'a')]);
      await eventually(async () => expect((await inbox.listHalted({ consumer: 'ledger' }))[0]?.held).toBe(1));
      mode.head = 'killing';
      expect(await inbox.resumeHalted('ledger', Moved.topic, 'a', 'retry')).toBe(1);
      const halts = await eventually(async () => {
        const listed = await inbox.listHalted({ consumer: 'ledger' });
        expect(listed.map((halt) => [halt.key, halt.resumed, halt.head?.envelope.messageId, halt.held])).toEqual([['a', null, a1, 1]]);
        return listed;
      }, 20_000);
      expect(halts[0]!.head!.error).toMatch(/^CRASH_LOOP: message never finished in 2 drain runs on 'ledger'/);
      expect(deaths, 'killed by maxCrashes drain runs, then not run again').toBe(2);
      expect(applied).toEqual([]);
      // A resume after the fix runs it afresh: the count was dropped with the halt.
      mode.head = 'fine';
      expect(await inbox.resumeHalted('ledger', Moved.topic, 'a', 'retry')).toBe(1);
      await eventually(() => expect(applied).toEqual([a1, a2]));
      await eventually(async () => expect(await inbox.listHalted()).toEqual([]));
      expect(processes).toBe(3);
    } finally {
      mode.head = 'fine';
      await Promise.all(live.map((bus) => bus.stop({ timeoutMs: 1_000 }).catch(() => undefined)));
      await broker.close();
    }
  });
});

describe("poison 'halt': replays of dead letters", () => {
  // Issue 29: a replayed dead letter that ended on the halt path was drained under the
  // consumer's own inbox record — which its dead-lettering had left — so the drain counted
  // it a duplicate and never applied it, while the dead letter was gone. And a replay
  // arriving while its key was halted was not held: it ran ahead of the halted head.
  it('a replay that fails again halts its key as a replay, one arriving on a halted key is held; both are applied in order when drained', async () => {
    const database = new InMemoryDatabase();
    const broker = new InMemoryBroker();
    const inbox = new InMemoryInboxStore({ database });
    const outbox = new InMemoryOutboxStore({ database });
    const producer = broker.connect();
    const broken = new Set<string>();
    const applied: string[] = [];
    const headers: Record<string, string>[] = [];
    const [m1, m2, n1] = [`m1-${newMessageId()}`, `m2-${newMessageId()}`, `n1-${newMessageId()}`];
    const subscribe = (poison: 'park' | 'halt') => {
      const bus = createBus({ outbox, inbox, transport: broker.connect(), relay: { pollIntervalMs: 20, pause: { initialDelayMs: 10, maxDelayMs: 20 } } });
      bus.subscribe(
        'ledger',
        Moved,
        async (message, context) => {
          headers.push({ ...message.headers });
          if (broken.has(message.messageId)) throw new UnrecoverableError(`broken ${message.messageId}`);
          context.tx.onCommit(() => applied.push(message.messageId));
        },
        { ordered: true, poison, retry: { maxAttempts: 2, initialDelayMs: 1, maxDelayMs: 1 } },
      );
      return bus;
    };
    // Dead-lettered while the subscription parked its poison (before it moved to 'halt').
    const parking = subscribe('park');
    await parking.start();
    broken.add(m1);
    broken.add(m2);
    await producer.publish([envelope(m1, 'a'), envelope(m2, 'a')]);
    await eventually(async () => expect((await producer.deadLetters!.list('ledger')).map((letter) => letter.envelope.messageId).sort()).toEqual([m1, m2].sort()));
    await parking.stop();
    const letters = new Map((await producer.deadLetters!.list('ledger')).map((letter) => [letter.envelope.messageId, letter.id]));
    broken.delete(m2);
    const halting = subscribe('halt');
    try {
      await halting.start();
      // m1 is still broken: its replay fails again and halts the key.
      expect(await producer.deadLetters!.replay('ledger', [letters.get(m1)!])).toBe(1);
      await eventually(async () => expect((await inbox.listHalted({ consumer: 'ledger' }))[0]?.head?.envelope.messageId).toBe(m1));
      // m2's replay and a new message of the key arrive while it is halted: both held.
      expect(await producer.deadLetters!.replay('ledger', [letters.get(m2)!])).toBe(1);
      await eventually(async () => expect((await inbox.listHalted({ consumer: 'ledger' }))[0]?.held).toBe(1));
      await producer.publish([envelope(n1, 'a')]);
      await eventually(async () => expect((await inbox.listHalted({ consumer: 'ledger' }))[0]?.held).toBe(2));
      expect(applied, 'nothing of the halted key ran ahead of its head').toEqual([]);
      broken.delete(m1);
      expect(await inbox.resumeHalted('ledger', Moved.topic, 'a', 'retry')).toBe(1);
      await eventually(() => expect(applied).toEqual([m1, m2, n1]));
      await eventually(async () => expect(await inbox.listHalted()).toEqual([]));
      expect(await producer.deadLetters!.list('ledger')).toEqual([]);
      expect((await inbox.stats()).consumers.find((entry) => entry.consumer === 'ledger')).toMatchObject({ replayed: 2, deadLetters: 2 });
      expect(headers.filter((seen) => Object.keys(seen).some((name) => name.startsWith('courier-'))), 'the handler saw a Courier header').toEqual([]);
    } finally {
      await halting.stop();
      await broker.close();
    }
  });
});
