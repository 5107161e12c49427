// Failure groups: the grouping `courier dead groups` (and any admin page) shows, with the
// error normalisation that decides which dead letters failed "the same way".
import { describe, expect, it } from 'vitest';
import { failureGroupId, groupFailures, normaliseErrorMessage, type FailureFacts } from '../src/index.js';

describe('normaliseErrorMessage', () => {
  it('turns ids, numbers, quoted values, timestamps and addresses into placeholders', () => {
    expect(normaliseErrorMessage('HandlerError [HANDLER_FAILED]: order 4711 not found')).toBe('HandlerError [HANDLER_FAILED]: order <n> not found');
    expect(normaliseErrorMessage(`no customer 'c-981' for order "A-17"`)).toBe(`no customer '<value>' for order "<value>"`);
    expect(normaliseErrorMessage('message 0190a1b2-3c4d-7e5f-8a9b-0c1d2e3f4a5b refused at 2026-12-03T20:14:53.123Z')).toBe('message <id> refused at <time>');
    expect(normaliseErrorMessage('trace 4bf92f3577b34da6a3ce929d0e0e4736 failed')).toBe('trace <id> failed');
    expect(normaliseErrorMessage('connect ECONNREFUSED 10.0.3.7:5432')).toBe('connect ECONNREFUSED <address>');
    expect(normaliseErrorMessage('ULID 01ARZ3NDEKTSV4RRFFQ69G5FAV gone')).toBe('ULID <id> gone');
  });

  it('keeps words, codes and class names; collapses whitespace; is idempotent', () => {
    const text = 'TransportError [PUBLISH_UNROUTABLE]:  no queue\n bound to   deadbeef';
    const once = normaliseErrorMessage(text);
    expect(once).toBe('TransportError [PUBLISH_UNROUTABLE]: no queue bound to deadbeef');
    expect(normaliseErrorMessage(once)).toBe(once);
    const numbered = normaliseErrorMessage(`row 12 of 'orders' at 2026-01-02: 3.5 s`);
    expect(normaliseErrorMessage(numbered)).toBe(numbered);
    expect(normaliseErrorMessage(null)).toBe('');
    expect(normaliseErrorMessage('')).toBe('');
  });

  it('bounds the result', () => {
    expect(normaliseErrorMessage('x'.repeat(5000)).length).toBe(300);
  });
});

describe('groupFailures', () => {
  const at = (minute: number) => new Date(Date.UTC(2026, 11, 3, 20, minute));
  const item = (type: string, code: string | null, error: string, consumer: string | null, minute: number | null): FailureFacts => ({
    type,
    code,
    error,
    consumer,
    at: minute === null ? null : at(minute),
  });

  it('groups by type, code, normalised error and consumer, largest group first, with first and last seen', () => {
    const items = [
      item('orders.Placed', 'HANDLER_FAILED', 'order 1 not found', 'billing', 5),
      item('orders.Placed', 'HANDLER_FAILED', 'order 2 not found', 'billing', 1),
      item('orders.Placed', 'HANDLER_FAILED', 'order 3 not found', 'billing', 9),
      item('orders.Placed', 'HANDLER_FAILED', 'order 4 not found', 'shipping', 2), // another consumer
      item('orders.Placed', 'PUBLISH_UNROUTABLE', 'order 5 not found', null, 3), // another code
      item('orders.Paid', 'HANDLER_FAILED', 'order 6 not found', 'billing', null), // another type; no time
    ];
    const groups = groupFailures(items, (facts) => facts);
    expect(groups.map((group) => [group.type, group.code, group.consumer, group.count])).toEqual([
      ['orders.Placed', 'HANDLER_FAILED', 'billing', 3],
      ...groups.slice(1).map((group) => [group.type, group.code, group.consumer, 1]),
    ]);
    expect(groups).toHaveLength(4);
    const [first] = groups;
    expect(first!.error).toBe('order <n> not found');
    expect(first!.firstSeen).toEqual(at(1));
    expect(first!.lastSeen).toEqual(at(9));
    expect(first!.members).toEqual(items.slice(0, 3));
    expect(first!.id).toBe(failureGroupId('orders.Placed', 'HANDLER_FAILED', 'order <n> not found', 'billing'));
    expect(first!.id).toMatch(/^[0-9a-f]{12}$/);
    const untimed = groups.find((group) => group.type === 'orders.Paid')!;
    expect([untimed.firstSeen, untimed.lastSeen]).toEqual([null, null]);
    // Every item in exactly one group.
    expect(groups.reduce((sum, group) => sum + group.count, 0)).toBe(items.length);
  });

  it('gives each group an id that depends on its key alone (the same in any order, any process)', () => {
    const items = [item('a', 'X', 'e 1', 'c', 1), item('b', 'X', 'e 2', 'c', 2), item('a', 'X', 'e 3', 'c', 3)];
    const forward = groupFailures(items, (facts) => facts).map((group) => group.id);
    const backward = groupFailures([...items].reverse(), (facts) => facts).map((group) => group.id);
    expect(forward).toEqual(backward);
    expect(new Set(forward).size).toBe(2);
    // Pinned, so a release that changes the id (and breaks runbooks naming groups) fails here.
    expect(failureGroupId('a', 'X', 'e <n>', 'c')).toBe(forward[0]);
    expect(failureGroupId('orders.Placed', 'HANDLER_FAILED', 'order <n> not found', 'billing')).toBe('3ef380dedc8f');
  });
});
