// Type-checks every workspace package that has a tsconfig.json, one tsc run each,
// so a package's tests and sources are checked with its own settings. Runs as many at
// once as there are CPUs; each package's output is printed whole when it finishes.
import { execFile } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';

const roots = ['packages', 'plugins', 'examples'];
const dirs = ['conformance', 'bench', 'e2e', 'packages/cli/console', ...roots.flatMap((root) => (existsSync(root) ? readdirSync(root).map((name) => join(root, name)) : []))].filter(
  (dir) => existsSync(join(dir, 'tsconfig.json')),
);

function check(dir) {
  return new Promise((resolve) => {
    execFile('node_modules/.bin/tsc', ['-p', join(dir, 'tsconfig.json')], { maxBuffer: 64 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (stdout) process.stdout.write(stdout);
      if (stderr) process.stderr.write(stderr);
      if (error) console.error(`typecheck FAILED: ${dir}`);
      else console.log(`typecheck ok: ${dir}`);
      resolve(error ? 1 : 0);
    });
  });
}

const queue = [...dirs];
let failed = 0;
const workers = Array.from({ length: Math.max(1, Math.min(availableParallelism(), queue.length)) }, async () => {
  for (let dir = queue.shift(); dir !== undefined; dir = queue.shift()) failed += await check(dir);
});
await Promise.all(workers);
process.exit(failed === 0 ? 0 : 1);
