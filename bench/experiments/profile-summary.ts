// Side-by-side self time of CPU profiles written by `textbook-ab.ts` (COURIER_AB_PROFILE=<folder>):
// the profiles of a line's rounds (`<line>-r<round>.cpuprofile`) are added up, and each line gets a
// column of self time per message (µs) by package, and by function, with idle left out (the
// profiles cover each line's whole run: the drain, plus its seeding and warm-up, which run in the
// database). Bench/README.md, "Issue 40", "The relay process's CPU per message".
//
//   node --conditions=@courier/source --import tsx experiments/profile-summary.ts <rows per round> <folder> [top]
import { readdirSync, readFileSync } from 'node:fs';
import { attribute, type CpuProfile } from './cpu-profile.js';

const rows = Number(process.argv[2]);
const folder = process.argv[3];
const top = Number(process.argv[4] ?? 30);
if (!Number.isSafeInteger(rows) || rows <= 0 || folder === undefined) throw new Error('usage: profile-summary.ts <rows per round> <folder> [top]');

const add = (map: Map<string, number>, key: string, ms: number) => map.set(key, (map.get(key) ?? 0) + ms);

/** Adds the profile's self time by package and by function to `into`, idle left out. */
function addUp(profile: CpuProfile, into: { byPackage: Map<string, number>; byFunction: Map<string, number> }): void {
  const { byPackage, byFunction } = attribute(profile);
  for (const [key, ms] of byPackage) if (key !== '(idle)') add(into.byPackage, key, ms);
  for (const [key, ms] of byFunction) if (key !== '(idle)') add(into.byFunction, key, ms);
}

const groups = new Map<string, { files: number; byPackage: Map<string, number>; byFunction: Map<string, number> }>();
for (const file of readdirSync(folder).filter((f) => f.endsWith('.cpuprofile')).sort()) {
  const line = file.replace(/-r\d+\.cpuprofile$/, '');
  const group = groups.get(line) ?? { files: 0, byPackage: new Map(), byFunction: new Map() };
  groups.set(line, group);
  group.files += 1;
  addUp(JSON.parse(readFileSync(`${folder}/${file}`, 'utf8')) as CpuProfile, group);
}
const lines = [...groups.keys()];

function table(title: string, pick: (group: { byPackage: Map<string, number>; byFunction: Map<string, number> }) => Map<string, number>): void {
  const keys = new Map<string, number>();
  for (const group of groups.values()) for (const [key, ms] of pick(group)) keys.set(key, Math.max(keys.get(key) ?? 0, ms / group.files));
  console.log(`\n${title} (self µs per message, mean of the rounds; idle left out)`);
  console.log(`| ${lines.join(' | ')} | |`);
  console.log(`|${lines.map(() => '---:').join('|')}|---|`);
  const total = lines.map((line) => [...pick(groups.get(line)!).values()].reduce((a, b) => a + b, 0) / groups.get(line)!.files);
  console.log(`| ${total.map((ms) => ((ms * 1000) / rows).toFixed(1)).join(' | ')} | **all** |`);
  for (const [key] of [...keys].sort((a, b) => b[1] - a[1]).slice(0, top)) {
    const cells = lines.map((line) => {
      const group = groups.get(line)!;
      return (((pick(group).get(key) ?? 0) * 1000) / rows / group.files).toFixed(2);
    });
    console.log(`| ${cells.join(' | ')} | ${key} |`);
  }
}

table('by package of the running script', (group) => group.byPackage);
table('by function (← nearest scripted caller)', (group) => group.byFunction);
