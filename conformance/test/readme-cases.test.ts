// The kit's README lists every case of the port suites by name, so an author reading it
// knows what will run; this keeps the list true as cases are added.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { busCaseNames } from '../src/bus-suite.js';
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

  it('lists every bus case by name, the SIGKILL scenarios included, and counts those right', () => {
    const names = [...busCaseNames.inProcess, ...busCaseNames.beside, ...busCaseNames.process];
    const missing = [...new Set(names)].filter((name) => !readme.includes(`\`${name}\``));
    expect(missing, 'add these to README.md "What each suite checks" (Bus)').toEqual([]);
    // The issue-30 author was told 12 when 14 ran: the number in the README follows the suite.
    expect(readme).toContain(`the ${busCaseNames.process.length} SIGKILL scenarios`);
    expect(readme.match(/\b(\d+) SIGKILL scenarios/g)?.filter((said) => said !== `${busCaseNames.process.length} SIGKILL scenarios`)).toEqual([]);
  });
});
