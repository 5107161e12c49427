// The IPC broker host must survive a worker that is SIGKILLed at any instant. CI once failed
// (mysql2 bus suite, "complete-before-commit: killed there") on an uncaught `write EPIPE`: a
// reply for the killed worker was sent after its process had died but before its channel's
// 'disconnect' event ran, and `child.send` without a callback reports that failure as an
// 'error' event — with no listener, an uncaught exception in the test process.
import { spawn } from 'node:child_process';
import { InMemoryBroker } from '@courier/core';
import { afterEach, describe, expect, it } from 'vitest';
import { hostBrokerFor } from '../src/bus/ipc-broker.js';

const children: ReturnType<typeof spawn>[] = [];
afterEach(() => {
  for (const child of children.splice(0)) child.kill('SIGKILL');
});

/** Blocks this thread (no event loop turn), so the child's death is not yet observed. */
const blockFor = (ms: number) => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);

describe('hostBrokerFor', () => {
  it('a reply to a worker that died before its channel closed is dropped, not thrown as an uncaught EPIPE', async () => {
    const child = spawn(process.execPath, ['-e', "process.on('message', () => {}); process.send('up');"], { stdio: ['ignore', 'ignore', 'inherit', 'ipc'] });
    children.push(child);
    await new Promise<void>((resolve) => child.once('message', () => resolve()));
    const broker = new InMemoryBroker();
    hostBrokerFor(broker, child);
    const errors: unknown[] = [];
    const uncaught = (error: unknown) => errors.push(error);
    process.on('uncaughtException', uncaught);
    try {
      child.kill('SIGKILL');
      // The process is gone and its end of the channel closed, but this process has not run
      // the event loop since, so the channel still reads as connected.
      blockFor(300);
      expect(child.connected).toBe(true);
      // A request that arrived before the kill: its reply goes out after the worker died.
      child.emit('message', { courier: 'publish', id: 1, envelopes: [] });
      await new Promise<void>((resolve) => child.once('exit', () => resolve()));
      await new Promise((resolve) => setTimeout(resolve, 50));
    } finally {
      process.off('uncaughtException', uncaught);
    }
    expect(errors).toEqual([]);
  });
});
