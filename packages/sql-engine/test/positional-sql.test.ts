import { describe, expect, it } from 'vitest';
import { toDriverStatement } from '../src/positional-sql.js';

describe('toDriverStatement', () => {
  it('numbers placeholders for PostgreSQL and expands an array into one placeholder per element', () => {
    const statement = toDriverStatement('SELECT count(pg_advisory_xact_lock(?, k)) FROM unnest(ARRAY[?]::int4[]) k WHERE x IN (?) AND y = ?', [7, [1, 2], ['a'], 'z'], 'numbered');
    expect(statement.sql).toBe('SELECT count(pg_advisory_xact_lock($1, k)) FROM unnest(ARRAY[$2, $3]::int4[]) k WHERE x IN ($4) AND y = $5');
    expect(statement.parameters).toEqual([7, 1, 2, 'a', 'z']);
  });

  it('keeps question marks for MySQL and SQLite, and leaves those in literals, identifiers and comments alone', () => {
    const statement = toDriverStatement(`SELECT '?', "a?b", \`c?\` -- why?\nFROM t /* ? */ WHERE s IN (?) AND v = 'it''s ?' AND w = ?`, [['x', 'y'], 3], 'question');
    expect(statement.sql).toBe(`SELECT '?', "a?b", \`c?\` -- why?\nFROM t /* ? */ WHERE s IN (?, ?) AND v = 'it''s ?' AND w = ?`);
    expect(statement.parameters).toEqual(['x', 'y', 3]);
  });

  it('refuses a statement whose placeholders and parameters do not match', () => {
    expect(() => toDriverStatement('SELECT ?, ?', [1], 'numbered')).toThrow(/more placeholders/);
    expect(() => toDriverStatement('SELECT ?', [1, 2], 'question')).toThrow(/1 placeholder\(s\) for 2/);
  });
});
