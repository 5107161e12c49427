import type { Readable } from 'node:stream';

/**
 * Reads a worker's stdout as one JSON message per line: each line that parses goes to
 * `onMessage` when it is a JSON object, any other line to `onOther`. A line that is not JSON is not the worker's: a
 * library in it wrote to stdout (the pg driver prints "Connection Error: …" when the server
 * ends a connection). Parsing it inside the 'data' listener threw out of the listener and
 * took the whole bench down, leaving the run's tables and queues behind.
 */
export function onJsonLines(stream: Readable, onMessage: (message: object) => void, onOther: (line: string) => void): void {
  let buffered = '';
  stream.setEncoding('utf8').on('data', (chunk: string) => {
    buffered += chunk;
    let newline;
    while ((newline = buffered.indexOf('\n')) >= 0) {
      const line = buffered.slice(0, newline);
      buffered = buffered.slice(newline + 1);
      let message: unknown;
      try {
        message = JSON.parse(line);
      } catch {
        message = undefined;
      }
      if (typeof message === 'object' && message !== null) onMessage(message);
      else onOther(line);
    }
  });
}
