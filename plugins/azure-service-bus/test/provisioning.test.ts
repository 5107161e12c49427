// The real-namespace provisioning decisions, checked against a fake administration client:
// no namespace is reachable from this project's machines, so this is what runs here.
import { describe, expect, it } from 'vitest';
import { type AdministrationPort, Provisioner, isoDuration, namespaceLockMs } from './support/provisioning.js';

interface Entity {
  options: Record<string, unknown>;
}

/** A namespace in memory that answers like the ATOM API: 409 for an entity that exists, 404 for one that does not. */
function fakeAdmin() {
  const topics = new Map<string, Entity & { subscriptions: Map<string, Entity> }>();
  const queues = new Map<string, Entity>();
  const calls: string[] = [];
  const conflict = () => Object.assign(new Error('exists'), { statusCode: 409, code: 'MessageEntityAlreadyExistsError' });
  const missing = () => Object.assign(new Error('missing'), { statusCode: 404, code: 'MessageEntityNotFoundError' });
  // An answer takes a while, as over HTTP, so calls made together overlap. Their length decides
  // nothing: Promise.all starts every call before any timer fires, and a slower one only overlaps more.
  const tick = () => new Promise((resolve) => setTimeout(resolve, 5));
  const admin = {
    topicExists: async (name: string) => (await tick(), topics.has(name)),
    createTopic: async (name: string, options: Record<string, unknown>) => {
      calls.push(`createTopic ${name}`);
      await tick();
      if (topics.has(name)) throw conflict();
      topics.set(name, { options, subscriptions: new Map() });
      return {};
    },
    subscriptionExists: async (topic: string, name: string) => (await tick(), topics.get(topic)?.subscriptions.has(name) ?? false),
    createSubscription: async (topic: string, name: string, options: Record<string, unknown>) => {
      calls.push(`createSubscription ${topic}/${name}`);
      await tick();
      const parent = topics.get(topic);
      if (!parent) throw missing();
      if (parent.subscriptions.has(name)) throw conflict();
      parent.subscriptions.set(name, { options });
      return {};
    },
    getSubscription: async (topic: string, name: string) => {
      const found = topics.get(topic)?.subscriptions.get(name);
      if (!found) throw missing();
      return { requiresSession: Boolean(found.options['requiresSession']) };
    },
    deleteSubscription: async (topic: string, name: string) => {
      calls.push(`deleteSubscription ${topic}/${name}`);
      topics.get(topic)?.subscriptions.delete(name);
      return {};
    },
    deleteTopic: async (name: string) => {
      calls.push(`deleteTopic ${name}`);
      if (!topics.delete(name)) throw missing();
      return {};
    },
    queueExists: async (name: string) => queues.has(name),
    createQueue: async (name: string, options: Record<string, unknown>) => {
      calls.push(`createQueue ${name}`);
      if (queues.has(name)) throw conflict();
      queues.set(name, { options });
      return {};
    },
    getQueue: async (name: string) => ({ requiresSession: Boolean(queues.get(name)?.options['requiresSession']) }),
    deleteQueue: async (name: string) => {
      calls.push(`deleteQueue ${name}`);
      queues.delete(name);
      return {};
    },
  };
  return { admin: admin as unknown as AdministrationPort, topics, queues, calls };
}

const needs = { lockDurationMs: 3_000, maxDeliveryCount: 100, duplicateDetection: true, autoDeleteOnIdleMs: 60_000 };

describe('real-namespace provisioning', () => {
  it('writes durations the way the ATOM API takes them, and keeps lock durations within 5 s – 5 min', () => {
    expect(isoDuration(5_000)).toBe('PT5S');
    expect(isoDuration(90_000)).toBe('PT1M30S');
    expect(isoDuration(600_000)).toBe('PT10M');
    expect(isoDuration(1)).toBe('PT1S');
    expect(namespaceLockMs(1_000)).toBe(5_000);
    expect(namespaceLockMs(3_600_000)).toBe(300_000);
  });

  it('creates a topic with duplicate detection and a subscription with the tests\' lock, delivery count and sessions, once however many ask at once', async () => {
    const { admin, topics, calls } = fakeAdmin();
    const provisioner = new Provisioner(admin, needs);
    await Promise.all([provisioner.ensureSubscription('t1.orders', 'payments', true), provisioner.ensureSubscription('t1.orders', 'payments', true), provisioner.ensureTopic('t1.orders')]);
    expect(calls).toEqual(['createTopic t1.orders', 'createSubscription t1.orders/payments']);
    expect(topics.get('t1.orders')!.options).toMatchObject({ requiresDuplicateDetection: true, duplicateDetectionHistoryTimeWindow: 'PT10M', autoDeleteOnIdle: 'PT5M' });
    expect(topics.get('t1.orders')!.subscriptions.get('payments')!.options).toMatchObject({ requiresSession: true, lockDuration: 'PT5S', maxDeliveryCount: 100, autoDeleteOnIdle: 'PT5M' });
  });

  it('uses an entity another process created first (409), and refuses one whose session setting differs', async () => {
    const { admin } = fakeAdmin();
    const worker = new Provisioner(admin, needs);
    const parent = new Provisioner(admin, needs);
    await Promise.all([worker.ensureSubscription('t2.orders', 'audit', false), parent.ensureSubscription('t2.orders', 'audit', false)]);
    await expect(new Provisioner(admin, needs).ensureSubscription('t2.orders', 'audit', true)).rejects.toThrow(/requiresSession false, the test needs true/);
  });

  it('forgets a failed creation so the next call tries again', async () => {
    const { admin, calls } = fakeAdmin();
    let failures = 1;
    const flaky = { ...admin, createTopic: async (name: string, options?: object) => (failures-- > 0 ? Promise.reject(new Error('network')) : admin.createTopic(name, options)) } as AdministrationPort;
    const provisioner = new Provisioner(flaky, needs);
    await expect(provisioner.ensureTopic('t3.orders')).rejects.toThrow('network');
    await provisioner.ensureTopic('t3.orders');
    expect(calls).toEqual(['createTopic t3.orders']);
  });

  it('cleanup deletes only what it created (topics take their subscriptions along; a subscription on a topic it did not create goes alone) and reports what it could not delete', async () => {
    const { admin, topics, queues, calls } = fakeAdmin();
    await admin.createTopic('shared', {});
    const provisioner = new Provisioner(admin, needs);
    await provisioner.ensureSubscription('shared', 'mine', false);
    await provisioner.ensureSubscription('t4.orders', 'mine', false);
    await provisioner.ensureQueue('t4-sessions', true, false);
    topics.delete('t4.orders'); // gone already (auto-delete-on-idle, say)
    const failures = await provisioner.cleanup();
    expect(calls.filter((call) => call.startsWith('delete'))).toEqual(['deleteSubscription shared/mine', 'deleteTopic t4.orders', 'deleteQueue t4-sessions']);
    expect(failures).toEqual([expect.stringContaining('topic t4.orders')]);
    expect(topics.has('shared')).toBe(true);
    expect(topics.get('shared')!.subscriptions.size).toBe(0);
    expect(queues.size).toBe(0);
  });
});
