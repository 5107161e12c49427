export type { CourierErrorCode, CourierErrorOptions } from './errors.js';
export {
  CourierError,
  ConfigError,
  ClosedError,
  StorageError,
  TransportError,
  SerializationError,
  UnrecoverableError,
  isRetriable,
  describeError,
} from './errors.js';
export type { Envelope, LengthLimit, PortLimits } from './envelope.js';
export {
  ENVELOPE_FIELDS,
  ENVELOPE_LIMITS,
  MAX_PRIORITY,
  PRIORITY_HEADER,
  RESERVED_HEADER_PREFIX,
  acceptEnvelope,
  decodeEnvelope,
  envelopePriority,
  headerProblems,
  isValidTopic,
  isValidType,
  payloadBytes,
} from './envelope.js';
export { REASON_LIMITS, boundReason, boundReasonText, boundText, hasUnstorableText, sanitizeText, unstorableCharacter } from './reason-text.js';
export type { JsonValue } from './json.js';
export { assertPlainJson, parsePayload, serializePayload } from './json.js';
export type { DecodedOf, MessageDefinition, MessageDefinitionConfig, PayloadOf, Upcaster } from './message-definition.js';
export { decodeForConsume, defineMessage, isPriority, validateForPublish } from './message-definition.js';
export type { RetryPolicy } from './retry.js';
export { DEFAULT_RETRY_POLICY, backoffDelay, retryPolicy } from './retry.js';
export type { LinkedSignal } from './signals.js';
export { abortableSleep, linkSignals, onAbort, whenAborted } from './signals.js';
export type { Logger } from './logger.js';
export { consoleLogger, defaultLogger, noopLogger } from './logger.js';
export type { FaultContext, FaultHook, FaultPoint } from './fault-points.js';
export { FAULT_POINTS } from './fault-points.js';
export type {
  AppendResult,
  AsyncAppendFlag,
  ClaimOptions,
  ClaimedBatch,
  CompleteAndClaimOptions,
  CompleteOptions,
  CompletedAndClaimed,
  DeadOutboxRecord,
  FailureDetail,
  HaltedKey,
  ListOptions,
  OutboxAppend,
  OutboxEngine,
  OutboxFailure,
  OutboxLease,
  OutboxRecord,
  OutboxState,
  OutboxOperations,
  OutboxStats,
  OutboxStore,
  PendingCompletion,
  PublishedId,
} from './outbox-store.js';
export { FAILURE_DETAIL_LIMITS } from './outbox-store.js';
export type {
  InboxDrainClaim,
  InboxHaltedKey,
  InboxHalts,
  InboxListParkedOptions,
  InboxParkedMessage,
  InboxResult,
  InboxResumeAction,
  InboxRunOptions,
  InboxStore,
} from './inbox-store.js';
export { hasInboxHalts } from './inbox-store.js';
export type { InboxConsumerStats, InboxNameCount, InboxOperations, InboxStats } from './inbox-operations.js';
export { inboxStatsFromCounts } from './inbox-operations.js';
export type { FailureFacts, FailureGroup } from './failure-groups.js';
export { failureGroupId, groupFailures, normaliseErrorMessage } from './failure-groups.js';
export type {
  DeadLetter,
  DeadLetterReason,
  Delivery,
  DeliveryHandler,
  Endpoint,
  PublishResult,
  Subscription,
  Transport,
  TransportCapabilities,
  TransportDeadLetters,
} from './transport.js';
export type {
  BusConfig,
  BusCounters,
  BusHealth,
  Handler,
  HandlerContext,
  OutboxPublisher,
  PoisonPolicy,
  PublishOptions,
  ReceivedMessage,
  RelayConfig,
  StartOptions,
  SubscribeOptions,
} from './bus-types.js';
export type { Bus, StopOptions } from './bus.js';
export { createBus } from './bus.js';
export type { MetricsReadSource, ObserveOptions } from './operator-metrics.js';
export { hasLogSlot, METRICS_READ_FAILURES, OPERATOR_GAUGES, observeDeadLetters, observeInbox, observeInboxHalts, observeLogSlot, observeOutbox, observeRelay, type LogSlotOperations, type ObserveDeadLettersOptions, type ObserveInboxOptions } from './operator-metrics.js';
export { BATCH_SIZE_HISTOGRAM, DURATION_HISTOGRAMS, PROMETHEUS_VIEWS } from './timed-transport.js';
export { CONNECTIVITY_CODES, DEFAULT_RELAY_BATCH_SIZE } from './relay.js';
export type { RelayLease } from './relay.js';
export { SCHEDULE_LIMITS, newMessageId } from './outbox-publisher.js';
export type { InMemoryDatabaseConfig, InMemoryTransactionState } from './in-memory/in-memory-database.js';
export { InMemoryDatabase, InMemoryTransaction } from './in-memory/in-memory-database.js';
export type { InMemoryOutboxStoreConfig } from './in-memory/in-memory-outbox-store.js';
export { InMemoryOutboxStore } from './in-memory/in-memory-outbox-store.js';
export type { InMemoryInboxStoreConfig } from './in-memory/in-memory-inbox-store.js';
export { InMemoryInboxStore } from './in-memory/in-memory-inbox-store.js';
export type { InMemoryBrokerConfig, InMemoryConnection, PublishRejection, SettleKind } from './in-memory/in-memory-broker.js';
export { InMemoryBroker } from './in-memory/in-memory-broker.js';
export { InMemoryTransport } from './in-memory/in-memory-transport.js';
