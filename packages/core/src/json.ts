import { SerializationError } from './errors.js';

/** A value that survives `JSON.stringify` then `JSON.parse` unchanged. */
export type JsonValue = null | boolean | number | string | readonly JsonValue[] | { readonly [key: string]: JsonValue };

/**
 * Serialises a payload to JSON text, refusing anything JSON would silently change or drop.
 *
 * Accepted: plain objects (prototype `Object.prototype` or `null`), dense arrays, strings,
 * finite numbers other than `-0`, booleans and `null`. Refused, with the path of the first
 * offending field: `undefined`, functions, symbols, BigInt, NaN/Infinity, `-0`, Dates, Maps,
 * Sets, class instances, sparse arrays and cycles. The walk is iterative-depth bounded
 * (`maxDepth`) so hostile input cannot overflow the stack.
 */
export function serializePayload(value: unknown, root = 'payload', maxDepth = 256): string {
  assertPlainJson(value, root, maxDepth);
  return JSON.stringify(value);
}

/**
 * Checks that `value` is plain JSON (see {@link serializePayload}) and throws a
 * `SerializationError` with code `PAYLOAD_NOT_JSON` naming the offending path otherwise.
 */
export function assertPlainJson(value: unknown, root = 'payload', maxDepth = 256): void {
  const ancestors = new Set<object>();
  const visit = (node: unknown, path: string, depth: number): void => {
    if (depth > maxDepth) fail(path, `is nested deeper than ${maxDepth} levels`);
    switch (typeof node) {
      case 'string':
      case 'boolean':
        return;
      case 'number':
        if (!Number.isFinite(node)) fail(path, `is ${String(node)}, which JSON turns into null`);
        if (Object.is(node, -0)) fail(path, 'is -0, which JSON turns into 0');
        return;
      case 'undefined':
        fail(path, 'is undefined, which JSON drops');
        return;
      case 'bigint':
        fail(path, 'is a BigInt, which JSON cannot encode (send it as a string)');
        return;
      case 'function':
        fail(path, 'is a function');
        return;
      case 'symbol':
        fail(path, 'is a symbol');
        return;
      default:
        break;
    }
    if (node === null) return;
    const object = node as object;
    if (ancestors.has(object)) fail(path, 'is a circular reference');
    if (Array.isArray(object)) {
      ancestors.add(object);
      for (let index = 0; index < object.length; index += 1) {
        if (!(index in object)) fail(`${path}[${index}]`, 'is a hole in a sparse array, which JSON turns into null');
        visit(object[index], `${path}[${index}]`, depth + 1);
      }
      ancestors.delete(object);
      return;
    }
    const prototype = Object.getPrototypeOf(object) as object | null;
    if (prototype !== Object.prototype && prototype !== null) {
      const kind = (object as { constructor?: { name?: string } }).constructor?.name ?? 'an object with a custom prototype';
      fail(path, `is a ${kind}, not a plain object (convert it to strings, numbers, arrays and plain objects)`);
    }
    if (Object.getOwnPropertySymbols(object).length > 0) fail(path, 'has symbol keys, which JSON drops');
    ancestors.add(object);
    for (const key of Object.keys(object)) {
      const descriptor = Object.getOwnPropertyDescriptor(object, key);
      if (descriptor && (descriptor.get !== undefined || descriptor.set !== undefined)) {
        fail(childPath(path, key), 'is an accessor property');
      }
      visit((object as Record<string, unknown>)[key], childPath(path, key), depth + 1);
    }
    ancestors.delete(object);
  };
  visit(value, root, 0);
}

/**
 * Parses JSON text into a value. Guarantees: never mutates any prototype (a `__proto__`
 * key becomes an own property, as `JSON.parse` defines), and malformed text becomes a
 * `SerializationError` rather than a `SyntaxError`.
 */
export function parsePayload(text: string, root = 'payload'): JsonValue {
  try {
    return JSON.parse(text) as JsonValue;
  } catch (error) {
    throw new SerializationError('PAYLOAD_NOT_JSON', `'${root}' is not valid JSON text`, { cause: error, path: root });
  }
}

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

function childPath(path: string, key: string): string {
  return IDENTIFIER.test(key) ? `${path}.${key}` : `${path}[${JSON.stringify(key)}]`;
}

function fail(path: string, reason: string): never {
  throw new SerializationError('PAYLOAD_NOT_JSON', `'${path}' ${reason}`, { path });
}
