// The operator console's pages: Overview (live numbers and charts), Failed messages (grouped
// by error, replay or purge a group or a selection, after a confirmation that lists what it
// touches), one message in full, and Halted keys (resume with retry or park). Every read and
// action goes through the server's API, which calls the `courier` commands' own functions.
import { Chart, Filler, Legend, LinearScale, LineController, LineElement, PointElement, Tooltip } from 'chart.js';
import { html, render } from 'htm/preact';
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { api, credentials, type ActionOutcome, type DeadPage, type Group, type HaltedKey, type Info, type Member, type Parked, type ParkedItem, type Process, type Rates, type Sample, type Stats } from './api.js';
import './style.css';

Chart.register(LineController, LineElement, PointElement, LinearScale, Legend, Tooltip, Filler);

const REFRESH_MS = 2_000;
/** docs/operations.md: CourierOutboxBacklogAge fires above 60 s. */
const BACKLOG_AGE_ALERT_MS = 60_000;

function age(ms: number | null | undefined): string {
  if (ms === null || ms === undefined) return '–';
  if (ms < 1_000) return `${Math.round(ms)} ms`;
  const s = ms / 1_000;
  if (s < 120) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 7_200) return `${Math.round(s / 60)} min`;
  if (s < 172_800) return `${Math.round(s / 3_600)} h`;
  return `${Math.round(s / 86_400)} d`;
}
const ago = (iso: string | null): string => (iso ? `${age(Date.now() - new Date(iso).getTime())} ago` : '–');

/** Polls `read` every `everyMs` while the page is shown; `reload()` reads at once (after an action). */
function usePoll<T>(read: () => Promise<T>, everyMs: number): { data: T | undefined; error: string | undefined; reload: () => void } {
  const [data, setData] = useState<T>();
  const [error, setError] = useState<string>();
  const [tick, setTick] = useState(0);
  useEffect(() => {
    let live = true;
    const run = (): void => {
      read().then(
        (value) => {
          if (!live) return;
          setData(value);
          setError(undefined);
        },
        (failure: unknown) => live && setError(failure instanceof Error ? failure.message : String(failure)),
      );
    };
    run();
    const timer = everyMs > 0 ? setInterval(run, everyMs) : undefined;
    return () => {
      live = false;
      if (timer) clearInterval(timer);
    };
  }, [tick]);
  return { data, error, reload: useCallback(() => setTick((value) => value + 1), []) };
}

function useHash(): string {
  const [hash, setHash] = useState(location.hash || '#/overview');
  useEffect(() => {
    const onChange = (): void => setHash(location.hash || '#/overview');
    addEventListener('hashchange', onChange);
    return () => removeEventListener('hashchange', onChange);
  }, []);
  return hash;
}

function Stat({ label, value, alert, testid }: { label: string; value: string | number; alert?: boolean; testid: string }) {
  return html`<div class=${`stat${alert ? ' alert' : ''}`} data-testid=${testid}><div class="value">${value}</div><div class="label">${label}</div></div>`;
}

function LineChart({ samples, series, title, testid, decimals = 0, alert = false }: { samples: Sample[]; series: { label: string; pick: (s: Sample) => number | null; color: string }[]; title: string; testid: string; decimals?: number; alert?: boolean }) {
  const canvas = useRef<HTMLCanvasElement>(null);
  const chart = useRef<Chart<'line', { x: number; y: number | null }[]> | undefined>(undefined);
  useEffect(() => {
    if (!canvas.current) return;
    chart.current = new Chart(canvas.current, {
      type: 'line',
      data: { datasets: series.map((one) => ({ label: one.label, data: [], borderColor: one.color, backgroundColor: `${one.color}33`, fill: true, pointRadius: 0, tension: 0 })) },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        parsing: false,
        scales: {
          x: { type: 'linear', ticks: { maxTicksLimit: 6, callback: (value) => new Date(Number(value)).toLocaleTimeString() } },
          y: { beginAtZero: true, ticks: { precision: decimals } },
        },
        plugins: { legend: { position: 'bottom' }, tooltip: { mode: 'index', intersect: false } },
      },
    });
    return () => chart.current?.destroy();
  }, []);
  useEffect(() => {
    const current = chart.current;
    if (!current) return;
    series.forEach((one, index) => {
      current.data.datasets[index]!.data = samples.map((sample) => ({ x: sample.at, y: one.pick(sample) }));
    });
    current.update('none');
    canvas.current?.setAttribute('data-points', String(samples.length));
    canvas.current?.setAttribute('data-series', series.map((one) => one.label).join('|'));
  }, [samples]);
  return html`<section class=${`card chart${alert ? ' alert' : ''}`} data-testid=${testid} data-alert=${String(alert)}><h3>${title}</h3><div class="chart-box"><canvas ref=${canvas}></canvas></div></section>`;
}

/**
 * The tiles' numbers: the samples of the last minute taken together (a sample's window is a
 * few seconds, too short to read a rate from), each latency the worst window's p99.
 */
function lastMinute(samples: Sample[]): Rates | null {
  const last = samples.at(-1)?.rates;
  if (!last) return null;
  const windows = samples.map((sample) => sample.rates!).filter((rates) => rates.to > last.to - 60_000);
  const seconds = windows.reduce((total, rates) => total + (rates.to - rates.from) / 1000, 0);
  const count = (pick: (rates: Rates) => number): number => windows.reduce((total, rates) => total + pick(rates) * ((rates.to - rates.from) / 1000), 0);
  const worst = (pick: (rates: Rates) => number | null): number | null => windows.reduce<number | null>((max, rates) => (pick(rates) === null ? max : Math.max(max ?? 0, pick(rates)!)), null);
  return {
    from: windows[0]!.from,
    to: last.to,
    publishedPerSecond: seconds > 0 ? count((rates) => rates.publishedPerSecond) / seconds : 0,
    publishFailuresPerSecond: seconds > 0 ? count((rates) => rates.publishFailuresPerSecond) / seconds : 0,
    processedPerSecond: seconds > 0 ? count((rates) => rates.processedPerSecond) / seconds : 0,
    deadLettered: windows.reduce((total, rates) => total + rates.deadLettered, 0),
    commitToConfirmP99: worst((rates) => rates.commitToConfirmP99),
    handlerP99: worst((rates) => rates.handlerP99),
    deliveryToAckP99: worst((rates) => rates.deliveryToAckP99),
    occurredToHandlerP99: worst((rates) => rates.occurredToHandlerP99 ?? null),
  };
}

function Overview() {
  const { data, error } = usePoll(api.stats, REFRESH_MS);
  const stats: Stats | undefined = data?.stats;
  const samples = data?.history ?? [];
  const o = stats?.outbox;
  const rated = samples.filter((sample) => sample.rates !== null);
  const latest: Rates | null = lastMinute(rated);
  // The alerts of docs/operations.md the endpoints decide, on the latest window.
  const latencyAlert = latest?.commitToConfirmP99 != null && latest.commitToConfirmP99 > (data?.alerts.publishLatencySeconds ?? Infinity);
  const failingAlert = (latest?.publishFailuresPerSecond ?? 0) > 0;
  const deadAlert = (latest?.deadLettered ?? 0) > 0;
  const fixed = (value: number | null | undefined, digits = 2): string => (value === null || value === undefined ? '–' : value.toFixed(digits));
  return html`<div>
    <h2>Overview</h2>
    ${latest &&
    html`<section class="card"><h3>Relays and consumers, last minute (from their /metrics)</h3><div class="stats">
      <${Stat} testid="rate-published" label="published / s" value=${fixed(latest.publishedPerSecond)} />
      <${Stat} testid="rate-handled" label="handled / s" value=${fixed(latest.processedPerSecond)} />
      <${Stat} testid="rate-failures" label="publish failures / s (CourierPublishFailing)" value=${fixed(latest.publishFailuresPerSecond)} alert=${failingAlert} />
      <${Stat} testid="rate-dead" label="dead-lettered (CourierDeadLettering)" value=${latest.deadLettered} alert=${deadAlert} />
      <${Stat} testid="p99-confirm" label="commit → confirm p99, worst window (CourierPublishLatency)" value=${latest.commitToConfirmP99 === null ? '–' : age(latest.commitToConfirmP99 * 1000)} alert=${latencyAlert} />
      <${Stat} testid="p99-publish-handler" label="publish → handler p99, worst window (occurredAt → first start; two hosts' clocks)" value=${latest.occurredToHandlerP99 == null ? '–' : age(latest.occurredToHandlerP99 * 1000)} />
    </div></section>`}
    ${error && html`<p class="error">could not read the stats: ${error}</p>`}
    ${stats?.unavailable.map((part) => html`<p class="error">could not read ${part.what}: ${part.error}${part.remedy ? html`<br /><small>remedy: ${part.remedy}</small>` : ''}</p>`)}
    ${o &&
    html`<section class="card"><h3>Outbox</h3><div class="stats">
      <${Stat} testid="outbox-pending" label="pending" value=${o.pending} />
      <${Stat} testid="outbox-in-flight" label="in flight" value=${o.inFlight} />
      <${Stat} testid="outbox-oldest" label="oldest pending" value=${age(o.oldestPendingAgeMs)} alert=${o.oldestPendingAgeMs > BACKLOG_AGE_ALERT_MS} />
      <${Stat} testid="outbox-dead" label="dead rows" value=${o.dead} alert=${o.dead > 0} />
      <${Stat} testid="outbox-halted" label="halted keys" value=${o.haltedKeys} alert=${o.haltedKeys > 0} />
    </div></section>`}
    ${stats && !o && html`<p class="note">The config has no outbox: no backlog to show.</p>`}
    ${stats?.logSlot && html`<${LogSlotCard} slot=${stats.logSlot} />`}
    <div class="charts">
      <${LineChart} testid="chart-backlog" title="Outbox backlog" samples=${samples} series=${[
        { label: 'pending', pick: (s: Sample) => s.pending, color: '#2563eb' },
        { label: 'in flight', pick: (s: Sample) => s.inFlight, color: '#16a34a' },
      ]} />
      <${LineChart} testid="chart-failures" title="Needs a person" samples=${samples} series=${[
        { label: 'dead letters', pick: (s: Sample) => s.dead, color: '#dc2626' },
        { label: 'halted keys', pick: (s: Sample) => s.halted, color: '#d97706' },
      ]} />
      ${rated.length > 0 &&
      html`<${LineChart} testid="chart-rates" title="Publish and handle rates (per second)" decimals=${2} alert=${failingAlert || deadAlert} samples=${rated} series=${[
          { label: 'published', pick: (s: Sample) => s.rates?.publishedPerSecond ?? null, color: '#2563eb' },
          { label: 'handled', pick: (s: Sample) => s.rates?.processedPerSecond ?? null, color: '#16a34a' },
          { label: 'publish failures', pick: (s: Sample) => s.rates?.publishFailuresPerSecond ?? null, color: '#dc2626' },
        ]} />
        <${LineChart} testid="chart-latency" title="Latency p99 (seconds)" decimals=${3} alert=${latencyAlert} samples=${rated} series=${[
          { label: 'commit → confirm', pick: (s: Sample) => s.rates?.commitToConfirmP99 ?? null, color: '#7c3aed' },
          { label: 'publish → handler', pick: (s: Sample) => s.rates?.occurredToHandlerP99 ?? null, color: '#be185d' },
          { label: 'handler run', pick: (s: Sample) => s.rates?.handlerP99 ?? null, color: '#0891b2' },
          { label: 'delivery → ack', pick: (s: Sample) => s.rates?.deliveryToAckP99 ?? null, color: '#ea580c' },
        ]} />`}
    </div>
    <section class="card"><h3>Consumer groups</h3>
      ${consumerRows(stats).length === 0
        ? html`<p class="note">No consumer has inbox records, halted keys or dead letters${stats?.transport === null ? '' : ''}.</p>`
        : html`<table data-testid="consumers"><thead><tr><th>consumer</th><th>waiting at the broker</th><th>inbox records</th><th>oldest record</th><th>dead-lettered (inbox marks)</th><th>replayed</th><th>transport dead letters</th><th>halted keys</th><th>held</th></tr></thead>
          <tbody>${consumerRows(stats).map(
            (row) => html`<tr data-testid="consumer-row" data-consumer=${row.consumer}>
              <td>${row.consumer}</td><td data-testid="waiting">${waitingText(stats, row)}</td><td>${row.records ?? '–'}</td><td>${age(row.oldest)}</td><td>${row.marks ?? '–'}</td><td>${row.replayed ?? '–'}</td>
              <td class=${row.dead ? 'alert' : ''}>${row.dead === undefined ? '–' : `${row.atLeast ? '≥' : ''}${row.dead}`}</td>
              <td class=${row.halted ? 'alert' : ''}>${row.halted ?? 0}</td><td>${row.held ?? 0}</td></tr>`,
          )}</tbody></table>`}
    </section>
  </div>`;
}

/**
 * A log-tailing outbox's replication slot. Red where docs/operations.md raises an alert or a
 * slot stops being useful: no reader (the slot keeps WAL for nobody), lag above 1 GiB
 * (CourierLogSlotHoldingWal's threshold), WAL the server no longer keeps for it (`lost`) or
 * may remove (`unreserved`).
 */
function LogSlotCard({ slot }: { slot: NonNullable<Stats['logSlot']> }) {
  if (!slot.exists) {
    return html`<section class="card" data-testid="log-slot"><h3>Log-tail slot <code>${slot.slot}</code></h3>
      <p class="note" data-testid="log-slot-missing">The slot does not exist on the server: a log-tail relay creates it when it starts; until then no WAL is held for it.</p></section>`;
  }
  return html`<section class="card" data-testid="log-slot"><h3>Log-tail slot <code>${slot.slot}</code></h3><div class="stats">
    <${Stat} testid="log-slot-reader" label="reader" value=${slot.active ? `server pid ${slot.activePid ?? '?'}` : 'none'} alert=${!slot.active} />
    <${Stat} testid="log-slot-lag" label="lag (WAL held; CourierLogSlotHoldingWal)" value=${bytes(slot.lagBytes)} alert=${slot.lagBytes > LOG_SLOT_LAG_ALERT_BYTES} />
    <${Stat} testid="log-slot-unread" label="unread for (PostgreSQL 17+)" value=${slot.inactiveForMs === null ? '–' : age(slot.inactiveForMs)} />
    <${Stat} testid="log-slot-wal" label="WAL status" value=${slot.walStatus ?? '–'} alert=${slot.walStatus === 'lost' || slot.walStatus === 'unreserved'} />
  </div></section>`;
}

/** CourierLogSlotHoldingWal's threshold (docs/alerts/courier.rules.yml): 1 GiB. */
const LOG_SLOT_LAG_ALERT_BYTES = 1024 ** 3;

function bytes(value: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let scaled = value;
  let unit = 0;
  while (scaled >= 1024 && unit < units.length - 1) {
    scaled /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${scaled} B` : `${scaled.toFixed(1)} ${units[unit]}`;
}

/** A consumer's lag at the broker as `courier stats` reads it: a count, "no queue", or "not available" where the transport cannot read it. */
function waitingText(stats: Stats | undefined, row: ConsumerRow): string {
  const lag = stats?.consumerLag;
  if (!lag) return '–';
  if (!lag.available) return 'not available';
  if (row.waiting === undefined) return '–';
  return row.waiting === null ? 'no queue' : String(row.waiting);
}

interface ConsumerRow {
  consumer: string;
  /** Messages waiting at the broker; null: no queue; undefined: not read. */
  waiting?: number | null;
  records?: number;
  oldest?: number;
  marks?: number;
  replayed?: number;
  dead?: number;
  atLeast?: boolean;
  halted?: number;
  held?: number;
}

function consumerRows(stats: Stats | undefined): ConsumerRow[] {
  const rows = new Map<string, ConsumerRow>();
  const row = (consumer: string): ConsumerRow => rows.get(consumer) ?? rows.set(consumer, { consumer }).get(consumer)!;
  for (const one of stats?.inbox?.consumers ?? []) Object.assign(row(one.consumer), { records: one.records, oldest: one.oldestRecordAgeMs, marks: one.deadLetters, replayed: one.replayed });
  for (const one of stats?.transport ?? []) Object.assign(row(one.consumer), { dead: one.deadLetters, atLeast: one.atLeast });
  for (const one of stats?.consumerLag?.consumers ?? []) Object.assign(row(one.consumer), { waiting: one.waiting });
  for (const one of stats?.consumerHalts ?? []) Object.assign(row(one.consumer), { halted: one.haltedKeys, held: one.held });
  return [...rows.values()].sort((a, b) => a.consumer.localeCompare(b.consumer));
}

interface Pending {
  readonly title: string;
  readonly detail: string;
  readonly rows: { label: string; cells: string[] }[];
  readonly columns: string[];
  readonly confirm: string;
  readonly danger: boolean;
  readonly run: () => Promise<string>;
}

/** Shows what an action will do and how many it touches, and runs it only on Confirm. */
function Confirm({ pending, close, done }: { pending: Pending; close: () => void; done: (message: string) => void }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string>();
  return html`<div class="overlay"><div class="dialog" role="dialog" data-testid="confirm">
    <h3>${pending.title}</h3>
    <p data-testid="confirm-detail">${pending.detail}</p>
    <div class="dialog-list"><table><thead><tr>${pending.columns.map((column) => html`<th>${column}</th>`)}</tr></thead>
      <tbody>${pending.rows.map((row) => html`<tr>${row.cells.map((cell) => html`<td>${cell}</td>`)}</tr>`)}</tbody></table></div>
    ${error && html`<p class="error" data-testid="confirm-error">${error}</p>`}
    <div class="buttons">
      <button onClick=${close} disabled=${busy}>Cancel</button>
      <button class=${pending.danger ? 'danger' : 'primary'} data-testid="confirm-run" disabled=${busy}
        onClick=${() => {
          setBusy(true);
          pending.run().then(
            (message) => done(message),
            (failure: unknown) => {
              setBusy(false);
              setError(failure instanceof Error ? failure.message : String(failure));
            },
          );
        }}>${pending.confirm}</button>
    </div>
  </div></div>`;
}

function outcomeText(action: 'replay' | 'purge', outcome: ActionOutcome): string {
  const changed = outcome.outbox + outcome.transport + outcome.inbox;
  const parts = [`${action === 'replay' ? 'replayed' : 'purged'} ${changed} of ${outcome.requested}`];
  if (outcome.alreadyChanged > 0) parts.push(`${outcome.alreadyChanged} had already changed (another operator, or a relay)`);
  if (outcome.heldBehind.length > 0) parts.push(`${outcome.heldBehind.length} replayed head(s) wait behind a new halt of their key`);
  return parts.join('; ');
}

/** The confirmation of a replay or purge of `members` (a group's, or a selection): what it does, to which, and how many. */
function pendingAction(action: 'replay' | 'purge', members: Member[], group?: Group): Pending {
  const actionable = members.filter((member) => member.actionable);
  const skipped = members.length - actionable.length;
  return {
    title: `${action === 'replay' ? 'Retry' : 'Purge'} ${actionable.length} message(s)${group ? ` of group ${group.id}` : ''}`,
    detail:
      (action === 'replay'
        ? `Publishes these ${actionable.length} message(s) again with their original messageId (outbox rows become pending, transport dead letters go back to their consumer). A consumer that already applied one recognises it: nothing is applied twice.`
        : `Deletes these ${actionable.length} message(s) for good.`) + (skipped > 0 ? ` ${skipped} parked consumer head(s) are left out: the inbox store cannot replay or delete them.` : ''),
    columns: ['ref', 'topic', 'key', 'attempts', 'parked'],
    rows: actionable.map((member) => ({ label: member.ref, cells: [member.ref, member.topic, member.key ?? '–', member.attempts === null ? '–' : String(member.attempts), ago(member.parkedAt)] })),
    confirm: `${action === 'replay' ? 'Retry' : 'Purge'} ${actionable.length}`,
    danger: action === 'purge',
    run: async () =>
      outcomeText(
        action,
        await api.act(
          action,
          actionable.map((member) => member.ref),
          group?.id,
        ),
      ),
  };
}

/** With named tokens only an operator's token acts (the server refuses a viewer's too). */
const isReadOnly = (info: Info | undefined): boolean => info?.readOnly !== false || (info.namedTokens && info.you?.role !== 'operator');

/** The two views of the failed messages: grouped by error, or every message a page at a time. */
function FailedTabs({ view }: { view: 'groups' | 'all' }) {
  return html`<div class="tabs">
    <a href="#/failed" class=${view === 'groups' ? 'active' : ''} data-testid="view-groups">Grouped by error</a>
    <a href="#/failed/all" class=${view === 'all' ? 'active' : ''} data-testid="view-all">All, page by page</a>
  </div>`;
}

function Failed({ info, flash }: { info: Info | undefined; flash: (message: string) => void }) {
  const { data, error, reload } = usePoll(api.groups, REFRESH_MS * 3);
  const [open, setOpen] = useState<string>();
  const [selected, setSelected] = useState<Set<string>>(new Set());
  const [pending, setPending] = useState<Pending>();
  const readOnly = isReadOnly(info);
  const ask = (action: 'replay' | 'purge', members: Member[], group?: Group): void => setPending(pendingAction(action, members, group));
  const groups = data?.groups ?? [];
  const allMembers = groups.flatMap((group) => group.members);
  const picked = allMembers.filter((member) => selected.has(member.ref));
  return html`<div>
    <h2>Failed messages</h2>
    <${FailedTabs} view="groups" />
    ${error && html`<p class="error">${error}</p>`}
    ${data?.notes.map((note) => html`<p class="note">${note}</p>`)}
    ${data && groups.length === 0 && html`<p class="empty" data-testid="no-failures">No dead letters.</p>`}
    ${picked.length > 0 &&
    html`<div class="selection">${picked.length} selected
      <button disabled=${readOnly} onClick=${() => ask('replay', picked)} data-testid="retry-selected">Retry selected</button>
      <button disabled=${readOnly} class="danger" onClick=${() => ask('purge', picked)}>Purge selected</button>
      <button onClick=${() => setSelected(new Set())}>Clear</button></div>`}
    ${groups.map(
      (group) => html`<section class="card group" data-testid="group" data-group=${group.id} data-count=${group.count}>
        <div class="group-head">
          <div class="count">${group.count}</div>
          <div class="group-what">
            <div><strong>${group.type}</strong> <span class="badge">${group.code ?? 'no code'}</span> <span class="muted">${group.consumer ? `consumer ${group.consumer}` : 'outbox'}</span></div>
            <div class="error-text" data-testid="group-error">${group.error}</div>
            <div class="muted">first ${ago(group.firstSeen)} · last ${ago(group.lastSeen)} · group ${group.id}</div>
          </div>
          <div class="buttons">
            <button onClick=${() => setOpen(open === group.id ? undefined : group.id)}>${open === group.id ? 'Hide' : 'Show'} messages</button>
            <button class="primary" disabled=${readOnly} title=${readOnly ? `read-only: ${info?.readOnlyReason ?? ''}` : ''} data-testid="retry-group" onClick=${() => ask('replay', group.members, group)}>Retry group</button>
            <button class="danger" disabled=${readOnly} data-testid="purge-group" onClick=${() => ask('purge', group.members, group)}>Purge group</button>
          </div>
        </div>
        ${open === group.id &&
        html`<table><thead><tr><th></th><th>ref</th><th>topic</th><th>key</th><th>attempts</th><th>parked</th></tr></thead><tbody>
          ${group.members.map(
            (member) => html`<tr>
              <td><input type="checkbox" disabled=${!member.actionable} checked=${selected.has(member.ref)} onChange=${() => {
                const next = new Set(selected);
                if (next.has(member.ref)) next.delete(member.ref);
                else next.add(member.ref);
                setSelected(next);
              }} /></td>
              <td><a href=${`#/message/${encodeURIComponent(member.ref)}`}>${member.ref}</a></td><td>${member.topic}</td><td>${member.key ?? '–'}</td>
              <td>${member.attempts ?? '–'}</td><td>${ago(member.parkedAt)}</td></tr>`,
          )}</tbody></table>`}
      </section>`,
    )}
    ${pending &&
    html`<${Confirm} pending=${pending} close=${() => setPending(undefined)} done=${(message: string) => {
      setPending(undefined);
      setSelected(new Set());
      flash(message);
      reload();
    }} />`}
  </div>`;
}

/** Page sizes offered on the paged list (the server takes 1 to 10,000). */
const PAGE_SIZES = [5, 20, 50, 200];

/** A `GET /api/dead` item as a group member (what the confirmation and the actions take). */
function memberOf(item: ParkedItem): Member {
  return {
    ref: item.ref,
    state: item.state,
    source: item.source as Member['source'],
    consumer: item.consumer,
    topic: item.envelope.topic,
    key: item.envelope.key ?? null,
    messageId: item.envelope.messageId,
    attempts: item.attempts,
    parkedAt: item.parkedAt,
    // Parked consumer heads: the inbox store can neither replay nor delete them.
    actionable: item.source !== 'inbox',
  };
}

/**
 * Every failed message a page at a time, in `courier dead list`'s order (outbox rows, then
 * parked heads, then transport dead letters), through `GET /api/dead` — the same keyset
 * pages as the CLI's `--after`: a replay or purge between pages neither skips nor repeats a
 * message. Says "N of M shown" where M is counted without reading (else "N shown"), and
 * never hides that more follow. The page shown is read again every few seconds from the
 * same cursor.
 */
function FailedList({ info, flash }: { info: Info | undefined; flash: (message: string) => void }) {
  const [size, setSize] = useState(50);
  // The cursors of the pages read so far: [undefined] is the first page; the last is the page shown.
  const [cursors, setCursors] = useState<(string | undefined)[]>([undefined]);
  const [page, setPage] = useState<DeadPage>();
  const [error, setError] = useState<string>();
  const [tick, setTick] = useState(0);
  const [selected, setSelected] = useState<Set<string>>(new Set());
  const [pending, setPending] = useState<Pending>();
  const readOnly = isReadOnly(info);
  const after = cursors[cursors.length - 1];
  useEffect(() => {
    let live = true;
    const run = (): void => {
      api.dead(size, after).then(
        (value) => {
          if (!live) return;
          setPage(value);
          setError(undefined);
        },
        (failure: unknown) => live && setError(failure instanceof Error ? failure.message : String(failure)),
      );
    };
    run();
    const timer = setInterval(run, REFRESH_MS * 3);
    return () => {
      live = false;
      clearInterval(timer);
    };
  }, [size, after, tick]);
  const items = page?.items ?? [];
  // Shown so far: every earlier page was full (a page is `size` items unless it is the last).
  const before = (cursors.length - 1) * size;
  const shown = before + items.length;
  const counted = page ? (page.total !== null ? `${shown} of ${page.total} shown` : `${shown} shown`) : '';
  const picked = items.filter((item) => selected.has(item.ref)).map(memberOf);
  const restart = (): void => {
    setCursors([undefined]);
    setSelected(new Set());
  };
  return html`<div>
    <h2>Failed messages</h2>
    <${FailedTabs} view="all" />
    ${error && html`<p class="error">${error}</p>`}
    ${page?.notes.map((note) => html`<p class="note">${note}</p>`)}
    ${page && items.length === 0 && cursors.length === 1 && html`<p class="empty" data-testid="no-failures">No dead letters.</p>`}
    ${picked.length > 0 &&
    html`<div class="selection">${picked.length} selected
      <button disabled=${readOnly} onClick=${() => setPending(pendingAction('replay', picked))} data-testid="list-retry-selected">Retry selected</button>
      <button disabled=${readOnly} class="danger" onClick=${() => setPending(pendingAction('purge', picked))} data-testid="list-purge-selected">Purge selected</button>
      <button onClick=${() => setSelected(new Set())}>Clear</button></div>`}
    <section class="card">
      <div class="pager">
        <span data-testid="shown">${counted}${page?.next ? '; more follow' : ''}</span>
        <label>per page <select data-testid="page-size" value=${size} onChange=${(event: Event) => {
          setSize(Number((event.target as HTMLSelectElement).value));
          restart();
        }}>${PAGE_SIZES.map((option) => html`<option value=${option}>${option}</option>`)}</select></label>
        <button disabled=${cursors.length === 1} onClick=${restart} data-testid="first-page">First page</button>
        <button disabled=${cursors.length === 1} onClick=${() => {
          setCursors(cursors.slice(0, -1));
          setSelected(new Set());
        }} data-testid="previous-page">Previous</button>
        <button disabled=${!page?.next} onClick=${() => {
          if (!page?.next) return;
          setCursors([...cursors, page.next]);
          setSelected(new Set());
        }} data-testid="next-page">Next page</button>
      </div>
      ${items.length > 0 &&
      html`<table data-testid="dead-page"><thead><tr><th></th><th>ref</th><th>state</th><th>consumer</th><th>topic</th><th>key</th><th>code</th><th>attempts</th><th>parked</th></tr></thead><tbody>
        ${items.map(
          (item) => html`<tr data-testid="dead-item" data-ref=${item.ref}>
            <td><input type="checkbox" disabled=${item.source === 'inbox'} checked=${selected.has(item.ref)} onChange=${() => {
              const next = new Set(selected);
              if (next.has(item.ref)) next.delete(item.ref);
              else next.add(item.ref);
              setSelected(next);
            }} /></td>
            <td><a href=${`#/message/${encodeURIComponent(item.ref)}`}>${item.ref}</a></td><td>${item.state}</td><td>${item.consumer ?? 'outbox'}</td>
            <td>${item.envelope.topic}</td><td>${item.envelope.key ?? '–'}</td><td><span class="badge">${item.code ?? 'no code'}</span></td>
            <td>${item.attempts ?? '–'}</td><td>${ago(item.parkedAt)}</td></tr>`,
        )}</tbody></table>`}
    </section>
    ${pending &&
    html`<${Confirm} pending=${pending} close=${() => setPending(undefined)} done=${(message: string) => {
      setPending(undefined);
      setSelected(new Set());
      flash(message);
      setTick((value) => value + 1);
    }} />`}
  </div>`;
}

/** A payload as readable text: JSON text (what the envelope carries) indented, anything else as is. */
function pretty(payload: unknown): string {
  if (typeof payload !== 'string') return JSON.stringify(payload, null, 2);
  try {
    return JSON.stringify(JSON.parse(payload), null, 2);
  } catch {
    return payload;
  }
}

function MessageDetail({ reference }: { reference: string }) {
  const { data, error } = usePoll<Parked>(() => api.message(reference), 0);
  if (error) return html`<div><h2>Message</h2><p class="error">${error}</p><a href="#/failed">back to failed messages</a></div>`;
  if (!data) return html`<p>loading…</p>`;
  const { payload, headers, ...envelope } = data.envelope;
  return html`<div data-testid="message">
    <h2>Message ${data.ref}</h2>
    <p><a href="#/failed">← failed messages</a></p>
    <section class="card"><h3>Error</h3><p><span class="badge">${data.code ?? 'no code'}</span> ${data.state} · ${data.consumer ? `consumer ${data.consumer}` : 'outbox'} · attempts ${data.attempts ?? '–'} · parked ${ago(data.parkedAt)}</p><pre class="error-text">${data.error ?? '(no error recorded)'}</pre></section>
    <section class="card"><h3>Envelope</h3><pre>${JSON.stringify(envelope, null, 2)}</pre></section>
    <section class="card"><h3>Headers</h3><pre>${JSON.stringify(headers ?? {}, null, 2)}</pre></section>
    <section class="card"><h3>Payload</h3><pre data-testid="payload">${pretty(payload)}</pre></section>
  </div>`;
}

function Halted({ info, flash }: { info: Info | undefined; flash: (message: string) => void }) {
  const { data, error, reload } = usePoll(api.halted, REFRESH_MS * 2);
  const [pending, setPending] = useState<Pending>();
  // With named tokens only an operator's token acts (the server refuses a viewer's too).
  const readOnly = info?.readOnly !== false || (info.namedTokens && info.you?.role !== 'operator');
  const where = (key: HaltedKey): string => (key.consumer === null ? 'outbox' : `consumer ${key.consumer}`);
  const ask = (key: HaltedKey, action: 'retry' | 'park'): void =>
    setPending({
      title: `${action === 'retry' ? 'Resume (retry the head)' : 'Resume (park the head)'}: ${key.topic} / ${key.key}`,
      detail:
        action === 'retry'
          ? `Retries the head of this key once; the ${key.held} message(s) held behind it follow in order.${key.consumer !== null ? ' A running instance of the consumer drains it.' : ''}`
          : `Parks the head (it becomes a dead letter you can see under Failed messages) and lets the ${key.held} message(s) behind it go on, in order.`,
      columns: ['where', 'topic', 'key', 'head', 'held', 'error'],
      rows: [{ label: key.key, cells: [where(key), key.topic, key.key, key.headRef, String(key.held), key.error ?? '–'] }],
      confirm: action === 'retry' ? 'Retry head' : 'Park head',
      danger: action === 'park',
      run: async () => {
        const { changed } = await api.resume(key, action);
        return changed === 0 ? `${key.topic}/${key.key} had already been resumed; nothing changed` : `resumed ${where(key)} ${key.topic}/${key.key} (${action})`;
      },
    });
  const keys = data?.keys ?? [];
  return html`<div>
    <h2>Halted keys</h2>
    ${error && html`<p class="error">${error}</p>`}
    ${data?.notes.map((note) => html`<p class="note">${note}</p>`)}
    ${data && keys.length === 0 && html`<p class="empty" data-testid="no-halted">No halted keys.</p>`}
    ${keys.length > 0 &&
    html`<section class="card"><table data-testid="halted"><thead><tr><th>where</th><th>topic</th><th>key</th><th>head</th><th>held behind</th><th>resumed</th><th>error</th><th></th></tr></thead><tbody>
      ${keys.map(
        (key) => html`<tr data-testid="halted-key" data-key=${key.key}>
          <td>${where(key)}</td><td>${key.topic}</td><td>${key.key}</td><td>${key.headRef}</td><td>${key.held}</td><td>${key.resumed ?? '–'}</td><td class="error-text">${key.error ?? '–'}</td>
          <td><div class="buttons"><button class="primary" disabled=${readOnly || key.resumed !== null} data-testid="resume-retry" onClick=${() => ask(key, 'retry')}>Retry</button>
            <button class="danger" disabled=${readOnly || key.resumed !== null} data-testid="resume-park" onClick=${() => ask(key, 'park')}>Park</button></div></td></tr>`,
      )}</tbody></table></section>`}
    ${pending &&
    html`<${Confirm} pending=${pending} close=${() => setPending(undefined)} done=${(message: string) => {
      setPending(undefined);
      flash(message);
      reload();
    }} />`}
  </div>`;
}

function Processes() {
  const { data, error } = usePoll(api.processes, REFRESH_MS);
  const stats = usePoll(api.stats, REFRESH_MS).data?.stats;
  const processes: Process[] = data?.processes ?? [];
  return html`<div>
    <h2>Relays and consumers</h2>
    ${error && html`<p class="error">could not read the processes: ${error}</p>`}
    <p class="muted">Each process the config's <code>metrics</code> names, read through its <code>/metrics</code> and <code>/health</code> (the reader of <code>courier metrics</code>). A relay's owner is the outbox's <code>lease_owner</code>; its leases are the batches it is sending at this read. Relay lag is the outbox's oldest pending age${stats?.outbox ? html`: <b data-testid="relay-lag">${age(stats.outbox.oldestPendingAgeMs)}</b>, ${stats.outbox.inFlight} rows claimed under a lease` : ''}. A consumer's lag at the broker is on the Overview (consumer groups), where the transport can read it without consuming.</p>
    ${data && processes.length === 0 && html`<p class="note">The config names no <code>metrics</code> endpoints.</p>`}
    ${processes.length > 0 &&
    html`<table data-testid="processes"><thead><tr><th>process</th><th>alive</th><th>last seen</th><th>health</th><th>relay</th><th>consumers</th><th>last error</th></tr></thead><tbody>
      ${processes.map((one) => {
        const relay = one.health?.relay;
        const consumers = one.health?.consumers ?? [];
        const errors = [one.error, relay?.lastError, ...consumers.map((c) => (c.lastError ? `${c.consumer}: ${c.lastError}` : null))].filter(Boolean);
        return html`<tr data-testid=${`process-${one.name}`}>
          <td>${one.name}<br /><small class="muted">${one.url}</small></td>
          <td class=${one.up ? '' : 'alert'} data-testid="alive">${one.up ? 'alive' : 'NOT ANSWERING'}</td>
          <td>${one.lastSeen === null ? 'never' : `${age(Date.now() - one.lastSeen)} ago`}</td>
          <td class=${one.health && !one.health.ready ? 'alert' : ''}>${one.health ? `${one.health.status}${one.health.ready ? '' : ' (not ready)'}` : '–'}</td>
          <td class=${relay?.paused ? 'alert' : ''} data-testid="relay">${relay?.running ? `${relay.paused ? 'PAUSED' : 'running'}; last claim ${relay.sinceLastClaimMs < 0 ? 'never' : `${age(relay.sinceLastClaimMs)} ago`}` : '–'}
            ${relay?.running && relay.owner !== undefined && html`<div class="muted" data-testid="relay-owner">claims as <code>${relay.owner ?? '–'}</code></div>`}
            ${relay?.running &&
            relay.leases !== undefined &&
            (relay.leases.length === 0
              ? html`<div class="muted" data-testid="relay-leases">holds no lease (between batches)</div>`
              : relay.leases.map((lease) => html`<div data-testid="relay-lease" data-token=${lease.token}>holds lease ${lease.token}: ${lease.rows} row(s) for ${age(lease.heldForMs)}</div>`))}</td>
          <td>${consumers.length === 0 ? '–' : consumers.map((c) => html`<div class=${c.connected ? '' : 'alert'}>${c.consumer}: ${c.connected ? 'connected' : 'not connected'}, ${c.inFlight} in flight</div>`)}</td>
          <td class="error-text">${errors.join('\n')}</td>
        </tr>`;
      })}
    </tbody></table>`}
  </div>`;
}

function Credentials({ info }: { info: Info | undefined }) {
  const [operator, setOperator] = useState(credentials.operator);
  const [token, setToken] = useState(credentials.token);
  if (!info) return null;
  const tokenInput = html`<label>token <input data-testid="token" type="password" value=${token} onInput=${(event: Event) => {
    const value = (event.target as HTMLInputElement).value;
    setToken(value);
    credentials.token = value;
  }} /></label>`;
  if (info.namedTokens) {
    return html`<div class="credentials">
      <span class="badge ro" data-testid="you">${info.you ? `${info.you.name} (${info.you.role})` : 'no valid token'}</span>${tokenInput}
    </div>`;
  }
  return html`<div class="credentials">
    ${info.readOnly
      ? html`<span class="badge ro" data-testid="mode">read-only (${info.readOnlyReason})</span>`
      : html`<label>operator <input data-testid="operator" value=${operator} placeholder="your name" onInput=${(event: Event) => {
          const value = (event.target as HTMLInputElement).value;
          setOperator(value);
          credentials.operator = value;
        }} /></label>
        <label>token <input data-testid="token" type="password" value=${token} onInput=${(event: Event) => {
          const value = (event.target as HTMLInputElement).value;
          setToken(value);
          credentials.token = value;
        }} /></label>`}
  </div>`;
}

function App() {
  const hash = useHash();
  // Polled: with named tokens, whose token the page holds shows once it is typed in.
  const { data: info, error } = usePoll(api.info, REFRESH_MS);
  const [message, setMessage] = useState<string>();
  const flash = (text: string): void => setMessage(text);
  // An outcome belongs to the page it was done on.
  useEffect(() => setMessage(undefined), [hash]);
  const page = hash.split('/')[1] ?? 'overview';
  const nav = (to: string, label: string) => html`<a href=${`#/${to}`} class=${page === to || (to === 'failed' && page === 'message') ? 'active' : ''}>${label}</a>`;
  return html`<div>
    <header>
      <h1>Courier console</h1>
      <nav>${nav('overview', 'Overview')}${nav('failed', 'Failed messages')}${nav('halted', 'Halted keys')}${nav('processes', 'Relays and consumers')}</nav>
      <${Credentials} info=${info} />
    </header>
    <main>
      ${error && html`<p class="error">the console server is not answering: ${error}</p>`}
      ${info?.notes.map((note) => html`<p class="note">${note}</p>`)}
      ${message && html`<p class="flash" data-testid="flash">${message} <button onClick=${() => setMessage(undefined)}>×</button></p>`}
      ${page === 'failed'
        ? hash.split('/')[2] === 'all'
          ? html`<${FailedList} info=${info} flash=${flash} />`
          : html`<${Failed} info=${info} flash=${flash} />`
        : page === 'message'
          ? html`<${MessageDetail} reference=${decodeURIComponent(hash.slice('#/message/'.length))} />`
          : page === 'halted'
            ? html`<${Halted} info=${info} flash=${flash} />`
            : page === 'processes'
              ? html`<${Processes} />`
              : html`<${Overview} />`}
    </main>
  </div>`;
}

render(html`<${App} />`, document.getElementById('app')!);
