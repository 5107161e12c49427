// Type-checks every workspace package that has a tsconfig.json, one tsc run each,
// so a package's tests and sources are checked with its own settings.
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

const roots = ['packages', 'plugins', 'examples'];
const dirs = ['conformance', 'bench', ...roots.flatMap((root) => (existsSync(root) ? readdirSync(root).map((name) => join(root, name)) : []))];
let failed = 0;
for (const dir of dirs) {
  if (!existsSync(join(dir, 'tsconfig.json'))) continue;
  try {
    execFileSync('node_modules/.bin/tsc', ['-p', join(dir, 'tsconfig.json')], { stdio: 'inherit' });
    console.log(`typecheck ok: ${dir}`);
  } catch {
    failed += 1;
    console.error(`typecheck FAILED: ${dir}`);
  }
}
process.exit(failed === 0 ? 0 : 1);
