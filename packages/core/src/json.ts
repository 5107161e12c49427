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
  // The keys and indexes from the root to the node being checked. Its path is written out
  // only to report a problem: every publish walks every field, and building a path string
  // for each one (a regex test and a concatenation per key) was most of the walk's work.
  const trail: (string | number)[] = [];
  const fail = (reason: string): never => {
    const path = pathOf(root, trail);
    throw new SerializationError('PAYLOAD_NOT_JSON', `'${path}' ${reason}`, { path });
  };
  const visit = (node: unknown, depth: number): void => {
    if (depth > maxDepth) fail(`is nested deeper than ${maxDepth} levels`);
    switch (typeof node) {
      case 'string':
      case 'boolean':
        return;
      case 'number':
        if (!Number.isFinite(node)) fail(`is ${String(node)}, which JSON turns into null`);
        if (Object.is(node, -0)) fail('is -0, which JSON turns into 0');
        return;
      case 'undefined':
        fail('is undefined, which JSON drops');
        return;
      case 'bigint':
        fail('is a BigInt, which JSON cannot encode (send it as a string)');
        return;
      case 'function':
        fail('is a function');
        return;
      case 'symbol':
        fail('is a symbol');
        return;
      default:
        break;
    }
    if (node === null) return;
    const object = node as object;
    if (ancestors.has(object)) fail('is a circular reference');
    if (Array.isArray(object)) {
      ancestors.add(object);
      for (let index = 0; index < object.length; index += 1) {
        trail.push(index);
        if (!(index in object)) fail('is a hole in a sparse array, which JSON turns into null');
        visit(object[index], depth + 1);
        trail.pop();
      }
      ancestors.delete(object);
      return;
    }
    const prototype = Object.getPrototypeOf(object) as object | null;
    if (prototype !== Object.prototype && prototype !== null) {
      const kind = (object as { constructor?: { name?: string } }).constructor?.name ?? 'an object with a custom prototype';
      fail(`is a ${kind}, not a plain object (convert it to strings, numbers, arrays and plain objects)`);
    }
    if (Object.getOwnPropertySymbols(object).length > 0) fail('has symbol keys, which JSON drops');
    ancestors.add(object);
    for (const key of Object.keys(object)) {
      trail.push(key);
      const descriptor = Object.getOwnPropertyDescriptor(object, key);
      if (descriptor && (descriptor.get !== undefined || descriptor.set !== undefined)) fail('is an accessor property');
      visit((object as Record<string, unknown>)[key], depth + 1);
      trail.pop();
    }
    ancestors.delete(object);
  };
  visit(value, 0);
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

/** `root` followed by `.key`, `["odd key"]` or `[index]` for each step of `trail`. */
function pathOf(root: string, trail: readonly (string | number)[]): string {
  let path = root;
  for (const step of trail) {
    if (typeof step === 'number') path += `[${step}]`;
    else path += IDENTIFIER.test(step) ? `.${step}` : `[${JSON.stringify(step)}]`;
  }
  return path;
}
