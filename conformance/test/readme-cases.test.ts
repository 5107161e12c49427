// The kit's README lists every case of the port suites by name, so an author reading it
// knows what will run; this keeps the list true as cases are added.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { inboxStoreCases } from '../src/inbox-store-suite.js';
import { outboxStoreCases } from '../src/outbox-store-suite.js';
import { transportCases } from '../src/transport-suite.js';

const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');

describe('conformance/README.md', () => {
  for (const [suite, cases] of [
    ['transport', transportCases],
    ['outbox store', outboxStoreCases],
    ['inbox store', inboxStoreCases],
  ] as const) {
    it(`lists every ${suite} case by name`, () => {
      const missing = cases.map((testCase) => testCase.name).filter((name) => !readme.includes(`\`${name}\``));
      expect(missing, `add these to README.md "What each suite checks"`).toEqual([]);
    });
  }
});
