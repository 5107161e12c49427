// The console server's JSON API (packages/cli/src/console-server.ts), typed by what the
// pages read. Every call goes to the server that served the page.

export interface Sample {
  readonly at: number;
  readonly pending: number | null;
  readonly inFlight: number | null;
  readonly oldestPendingAgeMs: number | null;
  readonly dead: number | null;
  readonly halted: number | null;
  /** From the config's `metrics` endpoints, since the previous sample; null without them. */
  readonly rates: Rates | null;
}

export interface Rates {
  readonly from: number;
  readonly to: number;
  readonly publishedPerSecond: number;
  readonly publishFailuresPerSecond: number;
  readonly processedPerSecond: number;
  readonly deadLettered: number;
  readonly commitToConfirmP99: number | null;
  readonly handlerP99: number | null;
  readonly deliveryToAckP99: number | null;
  /** occurredAt (the producer's publish call) → the handler's first start; absent from a server older than this page. */
  readonly occurredToHandlerP99?: number | null;
}

export interface Alerts {
  readonly publishLatencySeconds: number;
}

export interface Process {
  readonly name: string;
  readonly url: string;
  readonly at: number;
  readonly up: boolean;
  readonly error: string | null;
  readonly lastSeen: number | null;
  readonly health: {
    readonly status: string;
    readonly ready: boolean;
    readonly relay?: {
      running: boolean;
      paused: boolean;
      lastError: string | null;
      sinceLastClaimMs: number;
      /** The name it claims under (the outbox's lease_owner); absent from a process older than this console. */
      owner?: string | null;
      /** The leases on batches it is sending now; absent from a process older than this console. */
      leases?: { token: string; rows: number; heldForMs: number }[];
    };
    readonly consumers?: { consumer: string; connected: boolean; inFlight: number; lastError: string | null }[];
  } | null;
  readonly totals: { relayPaused: number | null } | null;
}

export interface Stats {
  readonly outbox: { pending: number; oldestPendingAgeMs: number; inFlight: number; dead: number; haltedKeys: number } | null;
  readonly inbox: { consumers: { consumer: string; records: number; oldestRecordAgeMs: number; deadLetters: number; replayed: number }[] } | null;
  readonly consumerHalts: { consumer: string; haltedKeys: number; held: number }[] | null;
  readonly transport: { consumer: string; deadLetters: number; atLeast: boolean }[] | null;
  /**
   * The replication slot a log-tailing outbox (`PgLogicalOutboxStore`) reads, as `courier stats`
   * reads it (packages/cli/src/log-slot.ts): absent when the outbox does not tail a slot, null
   * when it could not be read (then named in `unavailable`).
   */
  readonly logSlot?: LogSlot | null;
  /** Each configured consumer's lag at the broker (`waiting: null`: no queue); `available: false` when the transport cannot read it. Absent from an older server. */
  readonly consumerLag?: { available: boolean; consumers: { consumer: string; waiting: number | null }[] } | null;
  readonly unavailable: { what: string; error: string; remedy?: string }[];
}

/** A log-tail slot: `exists: false` when the server has none (nothing creates it by reading). */
export interface LogSlot {
  readonly slot: string;
  readonly exists: boolean;
  readonly active: boolean;
  readonly activePid: number | null;
  readonly lagBytes: number;
  /** PostgreSQL 17+ (`inactive_since`); null before, and while the slot is read. */
  readonly inactiveForMs: number | null;
  readonly walStatus: string | null;
}

export interface Info {
  readonly readOnly: boolean;
  readonly readOnlyReason: string | null;
  /** Named tokens: every read needs one too; `you` is whose this page holds. */
  readonly namedTokens: boolean;
  readonly you: { name: string; role: 'viewer' | 'operator' } | null;
  readonly consumers: string[];
  readonly notes: string[];
}

export interface Member {
  readonly ref: string;
  readonly state: string;
  readonly source: 'outbox' | 'inbox' | 'transport';
  readonly consumer: string | null;
  readonly topic: string;
  readonly key: string | null;
  readonly messageId: string;
  readonly attempts: number | null;
  readonly parkedAt: string | null;
  readonly actionable: boolean;
}

export interface Group {
  readonly id: string;
  readonly count: number;
  readonly type: string;
  readonly code: string | null;
  readonly consumer: string | null;
  readonly error: string;
  readonly firstSeen: string | null;
  readonly lastSeen: string | null;
  readonly members: Member[];
}

export interface HaltedKey {
  readonly consumer: string | null;
  readonly topic: string;
  readonly key: string;
  readonly headRef: string;
  readonly held: number;
  readonly resumed: 'retry' | 'park' | null;
  readonly error: string | null;
}

export interface Parked {
  readonly ref: string;
  readonly source: string;
  readonly state: string;
  readonly consumer: string | null;
  readonly envelope: { messageId: string; topic: string; type: string; key?: string | null; headers?: Record<string, string>; payload: unknown; [field: string]: unknown };
  readonly code: string | null;
  readonly error: string | null;
  readonly attempts: number | null;
  readonly parkedAt: string | null;
}

/** One item of `GET /api/dead`: what `courier dead list --json` prints, with its cursor. */
export interface ParkedItem extends Parked {
  readonly cursor?: string;
}

/** A page of `GET /api/dead`: `next` is the cursor of the page after (null: the last page); `total` is null where counting would need a read. */
export interface DeadPage {
  readonly items: ParkedItem[];
  readonly next: string | null;
  readonly total: number | null;
  readonly notes: string[];
}

export interface ActionOutcome {
  readonly requested: number;
  readonly outbox: number;
  readonly transport: number;
  /** Parked consumer heads replayed or purged. */
  readonly inbox: number;
  readonly alreadyChanged: number;
  /** Replayed heads whose key was halted again meanwhile: they wait behind that halt. */
  readonly heldBehind: readonly string[];
}

/** Who acts, and with which token: kept in this browser (the token for the tab only). */
export const credentials = {
  get operator(): string {
    return localStorage.getItem('courier.operator') ?? '';
  },
  set operator(value: string) {
    localStorage.setItem('courier.operator', value);
  },
  get token(): string {
    return sessionStorage.getItem('courier.token') ?? '';
  },
  set token(value: string) {
    sessionStorage.setItem('courier.token', value);
  },
};

export class ApiError extends Error {
  override readonly name = 'ApiError';
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

async function call<T>(path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (credentials.operator) headers['x-courier-operator'] = credentials.operator;
  // Sent on reads too: with named tokens every request needs one.
  if (credentials.token) headers['authorization'] = `Bearer ${credentials.token}`;
  const response = await fetch(`./api/${path}`, { method: body === undefined ? 'GET' : 'POST', headers, ...(body !== undefined ? { body: JSON.stringify(body) } : {}) });
  const value = (await response.json().catch(() => ({ error: `HTTP ${response.status}` }))) as T & { error?: string; remedy?: string };
  if (!response.ok) throw new ApiError(response.status, `${value.error ?? `HTTP ${response.status}`}${value.remedy ? ` — ${value.remedy}` : ''}`);
  return value;
}

export const api = {
  info: () => call<Info>('info'),
  stats: () => call<{ stats: Stats; history: Sample[]; alerts: Alerts }>('stats'),
  processes: () => call<{ processes: Process[]; alerts: Alerts }>('processes'),
  groups: () => call<{ groups: Group[]; notes: string[] }>('groups'),
  message: (ref: string) => call<Parked>(`dead/${encodeURIComponent(ref)}`),
  /** One page of every failed message, in `courier dead list`'s order, after `after` (a page's `next`). */
  dead: (limit: number, after: string | undefined) => call<DeadPage>(`dead?limit=${limit}${after !== undefined ? `&after=${encodeURIComponent(after)}` : ''}`),
  halted: () => call<{ keys: HaltedKey[]; notes: string[] }>('halted'),
  act: (action: 'replay' | 'purge', refs: readonly string[], group?: string) => call<ActionOutcome>(`dead/${action}`, { refs, ...(group ? { group } : {}) }),
  resume: (key: Pick<HaltedKey, 'consumer' | 'topic' | 'key'>, action: 'retry' | 'park') => call<{ changed: number }>('halted/resume', { consumer: key.consumer, topic: key.topic, key: key.key, action }),
};
