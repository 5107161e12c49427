/** What {@link closeAmqp} needs of an amqplib channel or connection (`Channel`, `ConfirmChannel`, `ChannelModel`). */
interface Closable {
  close(): Promise<void>;
  once(event: 'close', listener: () => void): unknown;
  off(event: 'close', listener: () => void): unknown;
}

/**
 * Closes an amqplib channel or connection and resolves once it is closed, however that
 * came about. Internal.
 *
 * Why: amqplib answers `close()` only when the broker's `close-ok` arrives. When the
 * connection dies after the close was sent and before that answer (an outage, a broker
 * restart, a reset socket), amqplib moves the channel to closed and emits `'close'`, but
 * never calls the close's callback: the promise stays pending for ever (checked on
 * amqplib 2.3.1). A dead-letter read that awaited it never ended, and every later read of
 * the queue in the process waited behind it.
 *
 * Guarantees: never rejects (a close that fails leaves nothing open: the channel or
 * connection is closed either way); resolves at the broker's `close-ok`, at the `'close'`
 * event, or at once when it was closed already (amqplib then throws from `close()`);
 * removes its listener either way.
 */
export function closeAmqp(closable: Closable): Promise<void> {
  return new Promise<void>((resolve) => {
    const done = (): void => {
      closable.off('close', done);
      resolve();
    };
    closable.once('close', done);
    try {
      closable.close().then(done, done);
    } catch {
      done();
    }
  });
}
