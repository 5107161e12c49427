// CPU time of the database and broker server processes, read from /proc, so a bench can say
// what a drain cost the servers (shared with anything else running on the machine).
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

/**
 * CPU seconds (user + system) used so far by the server processes of each name (all
 * PostgreSQL backends together), read from /proc (Linux; clock ticks of 1/100 s). Servers
 * are shared with whatever else runs on the machine: a delta counts their work too.
 */
export function serverCpu(): Map<string, number> {
  const totals = new Map<string, number>();
  for (const [label, args] of [
    ['mariadbd', ['-x', 'mariadbd']],
    ['postgres', ['-x', 'postgres']],
    ['rabbitmq (beam.smp)', ['-f', 'beam.smp']],
  ] as const) {
    let pids: string[];
    try {
      pids = execFileSync('pgrep', [...args], { encoding: 'utf8' }).split('\n').filter((pid) => pid !== '');
    } catch {
      continue;
    }
    let ticks = 0;
    for (const pid of pids) {
      try {
        const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
        ticks += Number(fields[11]) + Number(fields[12]);
      } catch {
        // The process ended meanwhile.
      }
    }
    totals.set(label, ticks / 100);
  }
  return totals;
}

