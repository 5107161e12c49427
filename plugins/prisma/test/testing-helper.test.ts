// @courier/prisma/testing: a Prisma Client generated offline, once per Prisma version and schema
// text, into <projectDir>/.prisma-client/; bad options refused naming the option. (Every other
// test of this package loads its clients through it too, test/support/prisma-client.ts.)
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { generatePrismaClient, loadPrismaClient, prismaVersion } from '../src/testing.js';

const PACKAGE_DIR = fileURLToPath(new URL('..', import.meta.url));
const schema = (comment: string) =>
  `// ${comment}\ngenerator client {\n  provider = "prisma-client"\n  output   = "../somewhere/else"\n  moduleFormat = "esm"\n  importFileExtension = "ts"\n}\n\ndatasource db {\n  provider = "sqlite"\n}\n\nmodel Thing {\n  id String @id\n}\n`;

describe('@courier/prisma/testing', () => {
  it('generates a client offline into .prisma-client/<name>-<version>-<hash>, reuses it for the same schema, and loads its PrismaClient', { timeout: 180_000 }, async () => {
    const dir = generatePrismaClient({ schema: schema('helper test'), projectDir: PACKAGE_DIR, name: 'helper-test' });
    expect(dir.startsWith(join(PACKAGE_DIR, '.prisma-client', `helper-test-${prismaVersion(PACKAGE_DIR)}-`))).toBe(true);
    expect(existsSync(join(dir, 'client.ts'))).toBe(true);
    expect(generatePrismaClient({ schema: schema('helper test'), projectDir: PACKAGE_DIR, name: 'helper-test' })).toBe(dir);
    const changed = generatePrismaClient({ schema: schema('helper test, changed'), projectDir: PACKAGE_DIR, name: 'helper-test' });
    expect(changed).not.toBe(dir);
    const PrismaClient = await loadPrismaClient<new (options: { adapter: unknown }) => { thing: unknown }>({ schema: schema('helper test'), projectDir: PACKAGE_DIR, name: 'helper-test' });
    expect(typeof PrismaClient).toBe('function');
  });

  it('refuses bad options, naming the option, and generates nothing', () => {
    const cases: [unknown, RegExp][] = [
      [undefined, /'options' must be an object/],
      [{ schema: '', projectDir: PACKAGE_DIR }, /'schema' must be the text of a Prisma schema/],
      [{ schema: 'datasource db {\n  provider = "sqlite"\n}\n', projectDir: PACKAGE_DIR }, /'schema' has no generator 'output/],
      [{ schema: schema('x'), projectDir: join(PACKAGE_DIR, 'no-such-folder') }, /'projectDir' must be a project folder with a package.json/],
      [{ schema: schema('x'), projectDir: PACKAGE_DIR, name: '../escape' }, /'name' must be letters, digits/],
    ];
    for (const [options, message] of cases) {
      expect(() => generatePrismaClient(options as Parameters<typeof generatePrismaClient>[0])).toThrow(message);
    }
  });
});
