import { isAbsolute, resolve } from 'node:path';

/** The services scenarios can need. */
export type ServiceName = 'postgresql' | 'mariadb' | 'rabbitmq';
export const SERVICES: readonly ServiceName[] = ['postgresql', 'mariadb', 'rabbitmq'];

/** Command-line options of the bench. */
export interface BenchOptions {
  readonly quick: boolean;
  /** Scenario ids to run (1–13); all when not given. */
  readonly only: ReadonlySet<number> | null;
  /** Where to write the JSON results (also writes the Markdown table next to it). */
  readonly json: string | null;
  /** Services the user asks for; scenarios needing others are reported as "not requested". */
  readonly services: ReadonlySet<ServiceName>;
}

export const SCENARIO_NAMES: Readonly<Record<string, number>> = {
  producer: 1,
  drain: 2,
  backlog: 3,
  steady: 4,
  idle: 5,
  inbox: 6,
  ordered: 7,
  mariadb: 8,
  startup: 9,
  sql: 10,
  kafka: 11,
  e2e: 12,
  sqs: 13,
};

export const USAGE = `usage: pnpm bench [--quick] [--only scenario,…] [--services postgresql,mariadb,rabbitmq] [--json out.json]

  --quick      small sizes (CI smoke test, < 60 s)
  --only       scenarios by number (1-13) or name: ${Object.keys(SCENARIO_NAMES).join(', ')}
  --services   services to use (default: all); scenarios needing others are "not requested"
  --json       write results as JSON there, and the Markdown table beside it (.md)

Addresses: COURIER_PG_URL, COURIER_MARIADB_URL, COURIER_RABBITMQ_URL.`;

/** Parses argv; throws with the usage on a bad argument. */
export function parseOptions(argv: readonly string[]): BenchOptions {
  let quick = false;
  let only: Set<number> | null = null;
  let json: string | null = null;
  let services = new Set<ServiceName>(SERVICES);
  const problems: string[] = [];
  const value = (index: number, flag: string): string => {
    const next = argv[index + 1];
    if (next === undefined || next.startsWith('--')) {
      problems.push(`${flag} needs a value`);
      return '';
    }
    return next;
  };
  for (let index = 0; index < argv.length; index += 1) {
    const arg = argv[index]!;
    const [flag, inline] = arg.includes('=') ? [arg.slice(0, arg.indexOf('=')), arg.slice(arg.indexOf('=') + 1)] : [arg, undefined];
    const take = () => inline ?? value(index++, flag);
    switch (flag) {
      case '--quick':
        quick = true;
        break;
      case '--only': {
        only = new Set();
        for (const part of take().split(',').map((item) => item.trim()).filter(Boolean)) {
          const id = /^\d+$/.test(part) ? Number(part) : SCENARIO_NAMES[part];
          if (id === undefined || id < 1 || id > 13) problems.push(`unknown scenario '${part}'`);
          else only.add(id);
        }
        break;
      }
      case '--json': {
        const path = take();
        // pnpm runs the script in bench/; a relative path means the caller's directory.
        json = isAbsolute(path) ? path : resolve(process.env['INIT_CWD'] ?? process.cwd(), path);
        break;
      }
      case '--services': {
        services = new Set();
        for (const part of take().split(',').map((item) => item.trim()).filter(Boolean)) {
          const name = part === 'pg' || part === 'postgres' ? 'postgresql' : part;
          if (!(SERVICES as readonly string[]).includes(name)) problems.push(`unknown service '${part}'`);
          else services.add(name as ServiceName);
        }
        break;
      }
      case '--':
        break;
      case '--help':
      case '-h':
        console.log(USAGE);
        process.exit(0);
        break;
      default:
        problems.push(`unknown argument '${arg}'`);
    }
  }
  if (problems.length > 0) throw new Error(`${problems.join('; ')}\n\n${USAGE}`);
  return { quick, only, json, services };
}
