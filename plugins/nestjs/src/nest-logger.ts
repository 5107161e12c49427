import type { Logger as CourierLogger } from '@courier/core';
import { Logger } from '@nestjs/common';

/**
 * A Courier logger writing through Nest's `Logger` (context `Courier`, or `Courier:<name>`
 * for a named bus), so Courier's lines follow the application's logger, levels and format
 * (`app.useLogger(...)`). The module's default when the options give no `logger`; fields
 * are appended as JSON. Courier logs little at `info` (start, stop, recoveries) and never
 * per message.
 */
export function nestLogger(busName = 'default'): CourierLogger {
  const logger = new Logger(busName === 'default' ? 'Courier' : `Courier:${busName}`);
  const line = (message: string, fields?: Readonly<Record<string, unknown>>) =>
    fields === undefined || Object.keys(fields).length === 0 ? message : `${message} ${safeJson(fields)}`;
  return {
    debug: (message, fields) => logger.debug(line(message, fields)),
    info: (message, fields) => logger.log(line(message, fields)),
    warn: (message, fields) => logger.warn(line(message, fields)),
    error: (message, fields) => logger.error(line(message, fields)),
  };
}

function safeJson(fields: Readonly<Record<string, unknown>>): string {
  try {
    return JSON.stringify(fields);
  } catch {
    // A cycle or a BigInt in a field must not turn a log line into a thrown error.
    return String(Object.keys(fields));
  }
}
