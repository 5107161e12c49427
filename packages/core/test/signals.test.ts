import { getEventListeners } from 'node:events';
import { describe, expect, it, vi } from 'vitest';
import { abortableSleep, linkSignals, onAbort, whenAborted } from '../src/index.js';

const abortListeners = (signal: AbortSignal): number => getEventListeners(signal, 'abort').length;

describe('signals', () => {
  it('many waits pending at once put one listener on the signal, and none warns', async () => {
    const warnings: string[] = [];
    const onWarning = (warning: Error) => void (warning.name === 'MaxListenersExceededWarning' && warnings.push(warning.message));
    process.on('warning', onWarning);
    try {
      const stop = new AbortController();
      const sleeps = Array.from({ length: 50 }, () => abortableSleep(60_000, stop.signal));
      const links = Array.from({ length: 50 }, () => linkSignals([stop.signal]));
      expect(abortListeners(stop.signal)).toBe(1);
      stop.abort();
      await Promise.all(sleeps);
      expect(links.every((link) => link.signal.aborted)).toBe(true);
      await new Promise((resolve) => setImmediate(resolve));
      expect(warnings).toEqual([]);
    } finally {
      process.off('warning', onWarning);
    }
  });

  it('a wait that ends by its timer, or a disposed link, leaves nothing that runs at the abort', async () => {
    const stop = new AbortController();
    let ran = 0;
    const cancel = onAbort(stop.signal, () => (ran += 1));
    cancel();
    await abortableSleep(1, stop.signal);
    const link = linkSignals([stop.signal]);
    link.dispose();
    stop.abort();
    expect(ran).toBe(0);
    expect(link.signal.aborted).toBe(false);
  });

  it('an already aborted signal ends every wait at once (a listener added after the abort never runs)', async () => {
    const signal = AbortSignal.abort();
    let ran = false;
    onAbort(signal, () => (ran = true));
    expect(ran).toBe(true);
    // On a clock that does not move: a wait that ends at once needs none of it, where a
    // bound on the real clock failed whenever a loaded machine stalled between two lines.
    vi.useFakeTimers();
    try {
      const ended: string[] = [];
      void abortableSleep(60_000, signal).then(() => ended.push('sleep'));
      void whenAborted(signal).then(() => ended.push('whenAborted'));
      await vi.advanceTimersByTimeAsync(0);
      expect(ended).toEqual(['sleep', 'whenAborted']);
    } finally {
      vi.useRealTimers();
    }
    expect(linkSignals([new AbortController().signal, signal]).signal.aborted).toBe(true);
  });

  it('a link aborts with any parent or its deadline, and its own abort leaves the parents alone', async () => {
    const first = new AbortController();
    const second = new AbortController();
    const byParent = linkSignals([first.signal, second.signal]);
    second.abort();
    expect(byParent.signal.aborted).toBe(true);
    const byDeadline = linkSignals([first.signal], 5);
    await abortableSleep(50);
    expect(byDeadline.signal.aborted).toBe(true);
    const own = linkSignals([first.signal], Number.POSITIVE_INFINITY);
    own.abort();
    expect(own.signal.aborted).toBe(true);
    expect(first.signal.aborted).toBe(false);
  });

  it('a callback that throws does not stop the others', async () => {
    const stop = new AbortController();
    const uncaught: unknown[] = [];
    const onUncaught = (error: unknown) => void uncaught.push(error);
    process.prependListener('uncaughtException', onUncaught);
    try {
      let ran = false;
      onAbort(stop.signal, () => {
        throw new Error('boom');
      });
      onAbort(stop.signal, () => (ran = true));
      stop.abort();
      expect(ran).toBe(true);
      await new Promise((resolve) => setImmediate(resolve));
    } finally {
      process.off('uncaughtException', onUncaught);
    }
    expect(uncaught.map((error) => (error as Error).message)).toEqual(['boom']);
  });
});
