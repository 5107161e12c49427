/** How a driver numbers its placeholders: PostgreSQL's `$1, $2…`, or MySQL's and SQLite's `?`. */
export type PlaceholderStyle = 'numbered' | 'question';

/** A statement in the driver's placeholder style with its flat parameter list. */
export interface DriverStatement {
  readonly sql: string;
  readonly parameters: readonly unknown[];
}

/**
 * Rewrites one of the engine's statements (positional `?`, an array parameter standing for a
 * list: `IN (?)`, `ARRAY[?]`) into the driver's style, binding every value and interpolating
 * none. An array becomes one placeholder per element (an empty one, none — as knex, which
 * the engine's SQL was written against, expands it). A `?` inside a string literal, a quoted
 * identifier or a comment is left alone.
 *
 * Throws when the statement has more or fewer placeholders than `params` — a mismatch would
 * otherwise bind values to the wrong columns.
 */
export function toDriverStatement(sql: string, params: readonly unknown[], style: PlaceholderStyle): DriverStatement {
  if (params.length === 0 && !sql.includes('?')) return { sql, parameters: params };
  const parameters: unknown[] = [];
  let out = '';
  let next = 0;
  let from = 0;
  const placeholder = () => (style === 'numbered' ? `$${parameters.length}` : '?');
  for (let i = 0; i < sql.length; i += 1) {
    const char = sql[i];
    if (char === "'" || char === '"' || char === '`') {
      i = closing(sql, i, char);
      continue;
    }
    if (char === '-' && sql[i + 1] === '-') {
      const end = sql.indexOf('\n', i);
      i = end < 0 ? sql.length : end;
      continue;
    }
    if (char === '/' && sql[i + 1] === '*') {
      const end = sql.indexOf('*/', i + 2);
      i = end < 0 ? sql.length : end + 1;
      continue;
    }
    if (char !== '?') continue;
    if (next >= params.length) throw new Error(`the statement has more placeholders than the ${params.length} parameter(s) given`);
    const value = params[next];
    next += 1;
    out += sql.slice(from, i);
    from = i + 1;
    if (Array.isArray(value)) {
      const marks: string[] = [];
      for (const element of value) {
        parameters.push(element);
        marks.push(placeholder());
      }
      out += marks.join(', ');
    } else {
      parameters.push(value);
      out += placeholder();
    }
  }
  if (next !== params.length) throw new Error(`the statement has ${next} placeholder(s) for ${params.length} parameter(s)`);
  return { sql: out + sql.slice(from), parameters };
}

/** Index of the quote that closes the literal or identifier opened at `start` (a doubled quote escapes it). */
function closing(sql: string, start: number, quote: string): number {
  for (let i = start + 1; i < sql.length; i += 1) {
    if (sql[i] !== quote) continue;
    if (sql[i + 1] === quote) {
      i += 1;
      continue;
    }
    return i;
  }
  return sql.length;
}
