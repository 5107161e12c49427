// Side-by-side self time of CPU profiles written by `textbook-ab.ts` (COURIER_AB_PROFILE=<folder>):
// the profiles of a line's rounds (`<line>-r<round>.cpuprofile`) are added up, and each line gets a
// column of self time per message (µs) by package, and by function, with idle left out (the
// profiles cover each line's whole run: the drain, plus its seeding and warm-up, which run in the
// database). Bench/README.md, "Issue 40", "The relay process's CPU per message".
//
//   node --conditions=@courier/source --import tsx experiments/profile-summary.ts <rows per round> <folder> [top]
import { readdirSync, readFileSync } from 'node:fs';
import { scriptOwner } from './script-owner.js';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

const rows = Number(process.argv[2]);
const folder = process.argv[3];
const top = Number(process.argv[4] ?? 30);
if (!Number.isSafeInteger(rows) || rows <= 0 || folder === undefined) throw new Error('usage: profile-summary.ts <rows per round> <folder> [top]');

const add = (map: Map<string, number>, key: string, ms: number) => map.set(key, (map.get(key) ?? 0) + ms);

/** Self time (ms) by package and by "function ← nearest scripted caller", idle left out. */
function attribute(profile: CpuProfile, byPackage: Map<string, number>, byFunction: Map<string, number>): void {
  const nodes = new Map(profile.nodes.map((node) => [node.id, node]));
  const parent = new Map<number, number>();
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id);
  const name = (node: ProfileNode) => {
    const { functionName, url, lineNumber } = node.callFrame;
    return `${functionName || '(anonymous)'} ${scriptOwner(url) ?? ''}/${url.split('/').pop() ?? ''}:${lineNumber + 1}`;
  };
  profile.samples.forEach((id, index) => {
    const ms = (profile.timeDeltas[index + 1] ?? 0) / 1000;
    const node = nodes.get(id)!;
    const fn = node.callFrame.functionName;
    if (fn === '(idle)') return;
    if (fn.startsWith('(') && node.callFrame.url === '') {
      add(byPackage, fn, ms);
      add(byFunction, fn, ms);
      return;
    }
    let scripted: ProfileNode | undefined;
    for (let at: number | undefined = id; at !== undefined && scripted === undefined; at = parent.get(at)) {
      const frame = nodes.get(at)!;
      if (scriptOwner(frame.callFrame.url) !== undefined) scripted = frame;
    }
    add(byPackage, scripted ? scriptOwner(scripted.callFrame.url)! : '(native, no script on the stack)', ms);
    add(byFunction, `${name(node)}${scripted && scripted !== node ? ` ← ${name(scripted)}` : ''}`, ms);
  });
}

const groups = new Map<string, { files: number; byPackage: Map<string, number>; byFunction: Map<string, number> }>();
for (const file of readdirSync(folder).filter((f) => f.endsWith('.cpuprofile')).sort()) {
  const line = file.replace(/-r\d+\.cpuprofile$/, '');
  const group = groups.get(line) ?? { files: 0, byPackage: new Map(), byFunction: new Map() };
  groups.set(line, group);
  group.files += 1;
  attribute(JSON.parse(readFileSync(`${folder}/${file}`, 'utf8')) as CpuProfile, group.byPackage, group.byFunction);
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
