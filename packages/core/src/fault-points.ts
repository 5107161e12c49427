/**
 * The closed list of dangerous instants at which the engine calls its fault hook.
 *
 * The conformance suite has a scenario for every name, and a test fails if a name is
 * added here without one. Each entry documents exactly where the engine stops:
 */
export const FAULT_POINTS = [
  /**
   * Relay: the transport confirmed the batch; the store has not been told. Where the store
   * has `completeAndClaim`, the confirmed rows are then handed to the loop's next claim:
   * a crash here is a crash before that combined statement.
   */
  'after-publish-before-complete',
  /**
   * Relay: the completion ran but has not committed (the store calls the hook). Where the
   * store has `completeAndClaim`, that is the combined statement: the completion of the
   * previous batch and the next claim both ran, neither committed. Otherwise `complete`.
   */
  'complete-before-commit',
  /** Relay: the broker accepted the batch but the confirm never reaches the relay. */
  'confirm-lost',
  /**
   * Relay: confirmed rows are completed (or handed to the next `completeAndClaim`), failed
   * and released rows of the same batch not yet recorded.
   */
  'mid-batch',
  /** Relay: a batch is claimed and not yet published; a relay that stalls here goes stale. */
  'stale-relay',
  /** Consumer: the handler returned inside the inbox transaction, which has not committed. */
  'before-handler-commit',
  /** Consumer: the inbox transaction committed; the delivery is not yet acknowledged. */
  'after-handler-commit-before-ack',
  /** Consumer: a delivery was received and decoded; the inbox has not been consulted. */
  'concurrent-duplicate-delivery',
  /** Consumer or relay: a head message is about to be parked or halted. */
  'poison-head',
  /** Consumer: the start of a handler run has been counted; the handler has not started. */
  'crash-loop',
  /** Relay: about to hand a batch to the transport. */
  'broker-restart',
  /** Relay: about to claim a batch from the store. */
  'database-restart',
] as const;

/** One of {@link FAULT_POINTS}. */
export type FaultPoint = (typeof FAULT_POINTS)[number];

/** What the engine tells the fault hook about the instant. */
export interface FaultContext {
  /** The messages in hand at that instant. */
  readonly messageIds: readonly string[];
  /** The consumer name, for consumer-side points. */
  readonly consumer?: string;
}

/**
 * Called by the engine at every {@link FaultPoint}. Production code leaves it unset.
 *
 * Tests make it throw (the engine handles the error as it would a real failure at that
 * instant), never resolve (the worker is frozen there, an in-process crash), or end the
 * process (a real crash).
 */
export type FaultHook = (point: FaultPoint, context: FaultContext) => void | Promise<void>;
