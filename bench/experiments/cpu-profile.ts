// V8 CPU profiles (`Profiler.stop`'s `profile`) read the same way by `relay-cpu-profile.ts` and
// `profile-summary.ts`: each sample's self time, by the package of the nearest script on its stack,
// by function, and by the first Courier frame.
import { scriptOwner } from './script-owner.js';

export interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}

export interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

/** "function package/file:line" of a profile node. */
function frameName(node: ProfileNode): string {
  const { functionName, url, lineNumber } = node.callFrame;
  return `${functionName || '(anonymous)'} ${scriptOwner(url) ?? ''}/${url.split('/').pop() ?? ''}:${lineNumber + 1}`;
}

/**
 * Self time (ms) by package, by "function ← nearest scripted caller" and by first Courier frame,
 * from the samples and their time deltas. V8's own lines ("(garbage collector)", "(idle)",
 * "(program)": native, no JS frame) are keys of their own in every map, and count in `total`.
 */
export function attribute(profile: CpuProfile): { byPackage: Map<string, number>; byFunction: Map<string, number>; byCourier: Map<string, number>; total: number } {
  const nodes = new Map(profile.nodes.map((node) => [node.id, node]));
  const parent = new Map<number, number>();
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id);
  const byPackage = new Map<string, number>();
  const byFunction = new Map<string, number>();
  const byCourier = new Map<string, number>();
  let total = 0;
  const add = (map: Map<string, number>, key: string, ms: number) => map.set(key, (map.get(key) ?? 0) + ms);
  profile.samples.forEach((id, index) => {
    const ms = (profile.timeDeltas[index + 1] ?? 0) / 1000;
    total += ms;
    const node = nodes.get(id)!;
    const name = node.callFrame.functionName;
    // V8's own lines: "(garbage collector)", "(idle)", "(program)" (native, no JS frame).
    if (name.startsWith('(') && node.callFrame.url === '') {
      add(byPackage, name, ms);
      add(byFunction, name, ms);
      add(byCourier, name, ms);
      return;
    }
    let scripted: ProfileNode | undefined;
    let courier: ProfileNode | undefined;
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
      const frame = nodes.get(at)!;
      const pkg = scriptOwner(frame.callFrame.url);
      scripted ??= pkg === undefined ? undefined : frame;
      if (pkg?.startsWith('@courier/')) {
        courier = frame;
        break;
      }
    }
    add(byPackage, scripted ? scriptOwner(scripted.callFrame.url)! : '(native, no script on the stack)', ms);
    add(byFunction, `${frameName(node)}${scripted && scripted !== node ? ` ← ${frameName(scripted)}` : ''}`, ms);
    add(byCourier, courier ? frameName(courier) : '(no Courier frame)', ms);
  });
  return { byPackage, byFunction, byCourier, total };
}
