// A small Amazon SNS stand-in: an HTTP server speaking the SNS Query API (form-encoded
// POST, XML answers) for the actions the SNS → SQS transport uses, delivering every message
// to the SQS queues subscribed to its topic through the real SQS API (ElasticMQ here).
//
// Why: no SNS server installs on these machines (no Docker, no PyPI: no LocalStack or moto).
// `serverless-offline-sns` (npm) was read and not used: it answers Publish before it
// delivers and swallows delivery failures, drops message attributes on raw delivery, has no
// FIFO topics (no MessageGroupId / MessageDeduplicationId), no GetTopicAttributes or
// ListSubscriptionsByTopic, and pulls in the Serverless Framework.
//
// Each behaviour follows an AWS documentation page, linked where it is implemented. Where the
// stand-in differs from AWS on purpose, the comment says so:
// - it delivers to every subscribed queue *before* it answers Publish / PublishBatch, and a
//   delivery the SQS server fails (other than a missing queue) fails the call or the entry
//   with `InternalError`, so the publisher retries (AWS answers first and retries delivery
//   to SQS itself for days: https://docs.aws.amazon.com/sns/latest/dg/sns-message-delivery-retries.html);
// - it checks neither credentials, IAM nor the queue policy that lets a topic send to a
//   queue (https://docs.aws.amazon.com/sns/latest/dg/subscribe-sqs-queue-to-sns-topic.html):
//   a transport that forgets that policy passes here and fails on AWS;
// - notifications without raw delivery carry no Signature (nothing here can sign them);
// - no filter policies, delivery policies, KMS, data protection or HTTP/e-mail/Lambda
//   endpoints: Subscribe takes protocol `sqs` only.
import { createHash, randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { GetQueueUrlCommand, SendMessageCommand, type MessageAttributeValue, type SQSClient } from '@aws-sdk/client-sqs';

const XMLNS = 'http://sns.amazonaws.com/doc/2010-03-31/';
/** https://docs.aws.amazon.com/sns/latest/api/API_Publish.html: a message, attributes included, is at most 256 KiB. */
const MAX_MESSAGE_BYTES = 256 * 1024;
/** https://docs.aws.amazon.com/sns/latest/api/API_PublishBatch.html: at most 10 entries, 256 KiB together. */
const MAX_BATCH_ENTRIES = 10;
/** https://docs.aws.amazon.com/sns/latest/dg/fifo-message-dedup.html: the de-duplication interval is 5 minutes. */
const DEDUP_WINDOW_MS = 5 * 60 * 1000;
/** https://docs.aws.amazon.com/sns/latest/dg/sns-message-attributes.html: at most 10 attributes reach a raw SQS subscription. */
const RAW_SQS_MAX_ATTRIBUTES = 10;
/** https://docs.aws.amazon.com/sns/latest/api/API_ListSubscriptionsByTopic.html: up to 100 subscriptions a page. */
const PAGE = 100;

/** An SNS error answer (https://docs.aws.amazon.com/sns/latest/api/CommonErrors.html and each action's Errors list). */
class SnsFault extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly type: 'Sender' | 'Receiver' = status >= 500 ? 'Receiver' : 'Sender',
  ) {
    super(message);
  }
}
const invalid = (message: string) => new SnsFault(400, 'InvalidParameter', message);
const invalidValue = (message: string) => new SnsFault(400, 'InvalidParameterValue', message);
const notFound = (message: string) => new SnsFault(404, 'NotFound', message);

interface Topic {
  readonly arn: string;
  readonly name: string;
  readonly fifo: boolean;
  readonly contentBasedDeduplication: boolean;
  readonly attributes: Readonly<Record<string, string>>;
  /** De-duplication ids seen within the last 5 minutes (FIFO), with when they expire and the message id they got. */
  readonly dedup: Map<string, { expires: number; messageId: string; sequence: string }>;
  sequence: bigint;
}

interface SnsSubscription {
  readonly arn: string;
  readonly topicArn: string;
  readonly protocol: 'sqs';
  /** The queue's ARN. */
  readonly endpoint: string;
  readonly attributes: Readonly<Record<string, string>>;
}

/** One message attribute as published: https://docs.aws.amazon.com/sns/latest/api/API_MessageAttributeValue.html */
interface Attribute {
  readonly DataType: string;
  readonly StringValue?: string;
  readonly BinaryValue?: Buffer;
}

interface Outgoing {
  readonly message: string;
  readonly attributes: Readonly<Record<string, Attribute>>;
  readonly groupId?: string;
  readonly dedupId?: string;
  readonly subject?: string;
}

/** A delivery the stand-in discarded, as AWS would (a client-side error at the endpoint), kept for tests to read. */
export interface DiscardedDelivery {
  readonly subscriptionArn: string;
  readonly messageId: string;
  readonly reason: string;
}

export interface SnsStandInConfig {
  /** The SQS client deliveries go through (the stand-in never destroys it). */
  readonly sqs: SQSClient;
  /** Region in the ARNs (default us-east-1). */
  readonly region?: string;
  /** Account in the ARNs (default 000000000000). */
  readonly accountId?: string;
  /** Port to listen on, on 127.0.0.1 (default any free one). */
  readonly port?: number;
}

/** The Query API's flattened form (`A.member.1.B=…`) as a tree of plain objects keyed by segment. */
type Tree = { [segment: string]: Tree | string };

function treeOf(form: URLSearchParams): Tree {
  const root: Tree = {};
  for (const [key, value] of form) {
    const path = key.split('.');
    let node = root;
    for (const segment of path.slice(0, -1)) {
      const next = node[segment];
      if (typeof next === 'object') node = next;
      else node = node[segment] = {};
    }
    node[path.at(-1)!] = value;
  }
  return root;
}

const text = (node: Tree | string | undefined): string | undefined => (typeof node === 'string' ? node : undefined);

/** A `member.N` list, in N order. */
function listOf(node: Tree | string | undefined): Tree[] {
  const members = typeof node === 'object' ? node['member'] : undefined;
  if (typeof members !== 'object') return [];
  return Object.entries(members)
    .sort(([a], [b]) => Number(a) - Number(b))
    .map(([, value]) => value)
    .filter((value): value is Tree => typeof value === 'object');
}

/** An `entry.N.key` / `entry.N.value` map. */
function mapOf(node: Tree | string | undefined): Record<string, string> {
  const entries = typeof node === 'object' ? node['entry'] : undefined;
  const out: Record<string, string> = {};
  if (typeof entries !== 'object') return out;
  for (const entry of Object.values(entries)) {
    if (typeof entry !== 'object') continue;
    const key = text(entry['key']);
    if (key !== undefined) out[key] = text(entry['value']) ?? '';
  }
  return out;
}

/** `MessageAttributes.entry.N.Name` / `.Value.DataType|StringValue|BinaryValue`. */
function attributesOf(node: Tree | string | undefined): Record<string, Attribute> {
  const entries = typeof node === 'object' ? node['entry'] : undefined;
  const out: Record<string, Attribute> = {};
  if (typeof entries !== 'object') return out;
  for (const entry of Object.values(entries)) {
    if (typeof entry !== 'object') continue;
    const name = text(entry['Name']);
    const value = entry['Value'];
    if (name === undefined || typeof value !== 'object') continue;
    const binary = text(value['BinaryValue']);
    const string = text(value['StringValue']);
    out[name] = { DataType: text(value['DataType']) ?? '', ...(string !== undefined ? { StringValue: string } : {}), ...(binary !== undefined ? { BinaryValue: Buffer.from(binary, 'base64') } : {}) };
  }
  return out;
}

const escapeXml = (value: string) => value.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&apos;');

/** XML of a plain value tree: strings are elements' text, arrays are `member` lists, `{ entry }` maps are key/value entries. */
function xmlOf(value: unknown): string {
  if (value === undefined) return '';
  if (typeof value === 'string') return escapeXml(value);
  if (Array.isArray(value)) return value.map((item) => `<member>${xmlOf(item)}</member>`).join('');
  if (value instanceof Map) return [...value].map(([key, item]) => `<entry><key>${escapeXml(String(key))}</key><value>${xmlOf(item)}</value></entry>`).join('');
  return Object.entries(value as Record<string, unknown>)
    .filter(([, item]) => item !== undefined)
    .map(([name, item]) => `<${name}>${xmlOf(item)}</${name}>`)
    .join('');
}

/**
 * The SNS stand-in. `start()` listens on 127.0.0.1; point an `SNSClient` at `endpoint` with
 * any region and credentials. State (topics, subscriptions, de-duplication ids) lives in
 * memory and ends with the process.
 */
export class SnsStandIn {
  readonly #server: Server;
  readonly #sqs: SQSClient;
  readonly #region: string;
  readonly #account: string;
  readonly #topics = new Map<string, Topic>();
  readonly #subscriptions = new Map<string, SnsSubscription>();
  readonly #queueUrls = new Map<string, string>();
  /** Deliveries discarded as AWS discards them (a missing queue, too many attributes for raw delivery). */
  readonly discarded: DiscardedDelivery[] = [];
  /** Requests answered so far, by action: lets a test see what a transport called. */
  readonly calls = new Map<string, number>();

  private constructor(server: Server, config: SnsStandInConfig) {
    this.#server = server;
    this.#sqs = config.sqs;
    this.#region = config.region ?? 'us-east-1';
    this.#account = config.accountId ?? '000000000000';
  }

  static async start(config: SnsStandInConfig): Promise<SnsStandIn> {
    const server = createServer();
    const standIn = new SnsStandIn(server, config);
    server.on('request', (request: IncomingMessage, response: ServerResponse) => void standIn.#answer(request, response));
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(config.port ?? 0, '127.0.0.1', () => resolve());
    });
    return standIn;
  }

  get port(): number {
    return (this.#server.address() as AddressInfo).port;
  }

  get endpoint(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async close(): Promise<void> {
    this.#server.closeAllConnections();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }

  async #answer(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const requestId = randomUUID();
    try {
      const chunks: Buffer[] = [];
      for await (const chunk of request) chunks.push(chunk as Buffer);
      const form = new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
      const action = form.get('Action') ?? '';
      this.calls.set(action, (this.calls.get(action) ?? 0) + 1);
      const params = treeOf(form);
      const result = await this.#run(action, params);
      const body = `<?xml version="1.0"?><${action}Response xmlns="${XMLNS}">${result === undefined ? '' : `<${action}Result>${xmlOf(result)}</${action}Result>`}<ResponseMetadata><RequestId>${requestId}</RequestId></ResponseMetadata></${action}Response>`;
      response.writeHead(200, { 'content-type': 'text/xml', 'x-amzn-requestid': requestId }).end(body);
    } catch (error) {
      const fault = error instanceof SnsFault ? error : new SnsFault(500, 'InternalError', error instanceof Error ? error.message : String(error));
      const body = `<?xml version="1.0"?><ErrorResponse xmlns="${XMLNS}"><Error><Type>${fault.type}</Type><Code>${fault.code}</Code><Message>${escapeXml(fault.message)}</Message></Error><RequestId>${requestId}</RequestId></ErrorResponse>`;
      if (!response.headersSent) response.writeHead(fault.status, { 'content-type': 'text/xml', 'x-amzn-requestid': requestId }).end(body);
    }
  }

  #run(action: string, params: Tree): unknown {
    switch (action) {
      case 'CreateTopic':
        return this.#createTopic(params);
      case 'GetTopicAttributes':
        return { Attributes: new Map(Object.entries(this.#topicAttributes(this.#topic(text(params['TopicArn']))))) };
      case 'DeleteTopic':
        return this.#deleteTopic(params);
      case 'ListTopics':
        return this.#listTopics(params);
      case 'Subscribe':
        return this.#subscribe(params);
      case 'GetSubscriptionAttributes':
        return { Attributes: new Map(Object.entries(this.#subscriptionAttributes(params))) };
      case 'ListSubscriptionsByTopic':
        return this.#listSubscriptions(params);
      case 'Unsubscribe':
        return this.#unsubscribe(params);
      case 'Publish':
        return this.#publish(params);
      case 'PublishBatch':
        return this.#publishBatch(params);
      default:
        // https://docs.aws.amazon.com/sns/latest/api/CommonErrors.html: InvalidAction (400).
        throw new SnsFault(400, 'InvalidAction', `the action '${action}' is not valid for this endpoint (the stand-in implements only what the transport uses)`);
    }
  }

  #arn(name: string): string {
    return `arn:aws:sns:${this.#region}:${this.#account}:${name}`;
  }

  #topic(arn: string | undefined): Topic {
    if (arn === undefined) throw invalid('TopicArn is required');
    const topic = this.#topics.get(arn);
    // https://docs.aws.amazon.com/sns/latest/api/API_GetTopicAttributes.html: NotFound, "Topic does not exist".
    if (topic === undefined) throw notFound('Topic does not exist');
    return topic;
  }

  /**
   * https://docs.aws.amazon.com/sns/latest/api/API_CreateTopic.html: names of 1-256 A-Z a-z
   * 0-9 - _, a FIFO topic's ending in `.fifo` with `FifoTopic=true`; idempotent — the same
   * name returns the same ARN, and different attributes for an existing name are refused
   * ("Topic already exists with different attributes").
   * https://docs.aws.amazon.com/sns/latest/dg/sns-fifo-topics.html: FifoTopic and
   * ContentBasedDeduplication are set at creation.
   */
  #createTopic(params: Tree): unknown {
    const name = text(params['Name']) ?? '';
    const attributes = mapOf(params['Attributes']);
    const fifo = attributes['FifoTopic'] === 'true';
    const base = fifo ? name.replace(/\.fifo$/, '') : name;
    if (!/^[A-Za-z0-9_-]{1,256}$/.test(base) || name.length > 256) throw invalid('Invalid parameter: Topic Name');
    if (fifo !== name.endsWith('.fifo')) throw invalid('Invalid parameter: Fifo Topic names must end with .fifo and must be made with FifoTopic=true');
    if (attributes['ContentBasedDeduplication'] === 'true' && !fifo) throw invalid('Invalid parameter: Attributes Reason: ContentBasedDeduplication can only be set for FIFO topics');
    const arn = this.#arn(name);
    const existing = this.#topics.get(arn);
    if (existing !== undefined) {
      for (const [key, value] of Object.entries(attributes)) {
        if ((existing.attributes[key] ?? (key === 'FifoTopic' || key === 'ContentBasedDeduplication' ? 'false' : undefined)) !== value) throw invalid('Invalid parameter: Attributes Reason: Topic already exists with different attributes');
      }
      return { TopicArn: arn };
    }
    this.#topics.set(arn, { arn, name, fifo, contentBasedDeduplication: attributes['ContentBasedDeduplication'] === 'true', attributes, dedup: new Map(), sequence: 10_000_000_000_000_000_000n });
    return { TopicArn: arn };
  }

  /** https://docs.aws.amazon.com/sns/latest/api/API_GetTopicAttributes.html (the attributes the stand-in has). */
  #topicAttributes(topic: Topic): Record<string, string> {
    const subscriptions = [...this.#subscriptions.values()].filter((subscription) => subscription.topicArn === topic.arn).length;
    return {
      TopicArn: topic.arn,
      Owner: this.#account,
      DisplayName: topic.attributes['DisplayName'] ?? '',
      SubscriptionsConfirmed: String(subscriptions),
      SubscriptionsPending: '0',
      SubscriptionsDeleted: '0',
      ...(topic.fifo ? { FifoTopic: 'true', ContentBasedDeduplication: String(topic.contentBasedDeduplication) } : {}),
    };
  }

  /** https://docs.aws.amazon.com/sns/latest/api/API_DeleteTopic.html: deletes its subscriptions too; a topic that does not exist is no error. */
  #deleteTopic(params: Tree): undefined {
    const arn = text(params['TopicArn']) ?? '';
    this.#topics.delete(arn);
    for (const [subscriptionArn, subscription] of this.#subscriptions) if (subscription.topicArn === arn) this.#subscriptions.delete(subscriptionArn);
    return undefined;
  }

  /** https://docs.aws.amazon.com/sns/latest/api/API_ListTopics.html: up to 100 a page, NextToken for the rest. */
  #listTopics(params: Tree): unknown {
    const all = [...this.#topics.keys()];
    const start = Number(text(params['NextToken']) ?? 0) || 0;
    const page = all.slice(start, start + PAGE);
    return { Topics: page.map((arn) => ({ TopicArn: arn })), NextToken: start + PAGE < all.length ? String(start + PAGE) : undefined };
  }

  /**
   * https://docs.aws.amazon.com/sns/latest/api/API_Subscribe.html: an SQS endpoint is a queue
   * ARN; a subscription in the same account needs no confirmation; the same endpoint with
   * the same attributes returns the existing subscription's ARN, with different ones it is
   * refused. https://docs.aws.amazon.com/sns/latest/dg/sns-large-payload-raw-message-delivery.html:
   * the `RawMessageDelivery` attribute. https://docs.aws.amazon.com/sns/latest/dg/fifo-topic-subscriptions.html:
   * a standard topic cannot deliver to a FIFO queue.
   */
  #subscribe(params: Tree): unknown {
    const topic = this.#topic(text(params['TopicArn']));
    const protocol = text(params['Protocol']) ?? '';
    const endpoint = text(params['Endpoint']) ?? '';
    const attributes = mapOf(params['Attributes']);
    if (protocol !== 'sqs') throw invalid(`Invalid parameter: Protocol '${protocol}' (the stand-in delivers to sqs only)`);
    if (!/^arn:aws[a-z-]*:sqs:[^:]*:[^:]*:[A-Za-z0-9_.-]{1,80}$/.test(endpoint)) throw invalid('Invalid parameter: SQS endpoint ARN');
    if (!topic.fifo && endpoint.endsWith('.fifo')) throw invalid('Invalid parameter: Invalid parameter: Endpoint Reason: FIFO SQS Queues can not be subscribed to standard SNS topics');
    for (const [key, value] of Object.entries(attributes)) {
      if (key === 'RawMessageDelivery' && value !== 'true' && value !== 'false') throw invalid('Invalid parameter: Attributes Reason: RawMessageDelivery: Invalid value');
      if (key !== 'RawMessageDelivery') throw invalid(`Invalid parameter: Attributes Reason: the stand-in does not implement '${key}'`);
    }
    const same = [...this.#subscriptions.values()].find((subscription) => subscription.topicArn === topic.arn && subscription.endpoint === endpoint);
    if (same !== undefined) {
      if ((same.attributes['RawMessageDelivery'] ?? 'false') !== (attributes['RawMessageDelivery'] ?? 'false')) throw invalid('Invalid parameter: Attributes Reason: Subscription already exists with different attributes');
      return { SubscriptionArn: same.arn };
    }
    const arn = `${topic.arn}:${randomUUID()}`;
    this.#subscriptions.set(arn, { arn, topicArn: topic.arn, protocol: 'sqs', endpoint, attributes });
    return { SubscriptionArn: arn };
  }

  /** https://docs.aws.amazon.com/sns/latest/api/API_GetSubscriptionAttributes.html */
  #subscriptionAttributes(params: Tree): Record<string, string> {
    const subscription = this.#subscriptions.get(text(params['SubscriptionArn']) ?? '');
    if (subscription === undefined) throw notFound('Subscription does not exist');
    return {
      SubscriptionArn: subscription.arn,
      TopicArn: subscription.topicArn,
      Protocol: subscription.protocol,
      Endpoint: subscription.endpoint,
      Owner: this.#account,
      ConfirmationWasAuthenticated: 'true',
      PendingConfirmation: 'false',
      RawMessageDelivery: subscription.attributes['RawMessageDelivery'] ?? 'false',
    };
  }

  /** https://docs.aws.amazon.com/sns/latest/api/API_ListSubscriptionsByTopic.html: up to 100 a page, NextToken for the rest. */
  #listSubscriptions(params: Tree): unknown {
    const topic = this.#topic(text(params['TopicArn']));
    const all = [...this.#subscriptions.values()].filter((subscription) => subscription.topicArn === topic.arn);
    const start = Number(text(params['NextToken']) ?? 0) || 0;
    const page = all.slice(start, start + PAGE);
    return {
      Subscriptions: page.map((subscription) => ({ SubscriptionArn: subscription.arn, Owner: this.#account, Protocol: subscription.protocol, Endpoint: subscription.endpoint, TopicArn: subscription.topicArn })),
      NextToken: start + PAGE < all.length ? String(start + PAGE) : undefined,
    };
  }

  /** https://docs.aws.amazon.com/sns/latest/api/API_Unsubscribe.html: NotFound for a subscription that does not exist. */
  #unsubscribe(params: Tree): undefined {
    const arn = text(params['SubscriptionArn']) ?? '';
    if (!this.#subscriptions.delete(arn)) throw notFound('Subscription does not exist');
    return undefined;
  }

  /** https://docs.aws.amazon.com/sns/latest/api/API_Publish.html */
  async #publish(params: Tree): Promise<unknown> {
    const topic = this.#topic(text(params['TopicArn']) ?? text(params['TargetArn']));
    const outgoing = this.#checked(topic, {
      message: text(params['Message']) ?? '',
      attributes: attributesOf(params['MessageAttributes']),
      ...optional('groupId', text(params['MessageGroupId'])),
      ...optional('dedupId', text(params['MessageDeduplicationId'])),
      ...optional('subject', text(params['Subject'])),
    });
    const { messageId, sequence } = await this.#deliver(topic, outgoing);
    return { MessageId: messageId, SequenceNumber: sequence };
  }

  /**
   * https://docs.aws.amazon.com/sns/latest/api/API_PublishBatch.html: 1-10 entries with
   * distinct ids (EmptyBatchRequest, TooManyEntriesInBatchRequest, BatchEntryIdsNotDistinct,
   * InvalidBatchEntryId: the whole call fails), at most 256 KiB together
   * (BatchRequestTooLong); an entry refused for itself is answered in `Failed` with its code
   * and `SenderFault`, while its neighbours are published.
   */
  async #publishBatch(params: Tree): Promise<unknown> {
    const topic = this.#topic(text(params['TopicArn']));
    const entries = listOf(params['PublishBatchRequestEntries']);
    if (entries.length === 0) throw new SnsFault(400, 'EmptyBatchRequest', 'The batch request does not contain any entries.');
    if (entries.length > MAX_BATCH_ENTRIES) throw new SnsFault(400, 'TooManyEntriesInBatchRequest', `The batch request contains more entries than permissible (${MAX_BATCH_ENTRIES}).`);
    const ids = entries.map((entry) => text(entry['Id']) ?? '');
    if (new Set(ids).size !== ids.length) throw new SnsFault(400, 'BatchEntryIdsNotDistinct', 'Two or more batch entries in the request have the same Id.');
    const badId = ids.find((id) => !/^[A-Za-z0-9_-]{1,80}$/.test(id));
    if (badId !== undefined) throw new SnsFault(400, 'InvalidBatchEntryId', `The Id '${badId}' of a batch entry does not abide by the specification.`);
    const outgoing = entries.map((entry) => ({
      message: text(entry['Message']) ?? '',
      attributes: attributesOf(entry['MessageAttributes']),
      ...optional('groupId', text(entry['MessageGroupId'])),
      ...optional('dedupId', text(entry['MessageDeduplicationId'])),
      ...optional('subject', text(entry['Subject'])),
    }));
    const total = outgoing.reduce((sum, entry) => sum + bytesOf(entry), 0);
    if (total > MAX_MESSAGE_BYTES) throw new SnsFault(400, 'BatchRequestTooLong', `The length of all the messages put together (${total} bytes) is more than the limit (${MAX_MESSAGE_BYTES}).`);
    const successful: unknown[] = [];
    const failed: unknown[] = [];
    // In entry order, one after another: a FIFO topic keeps the order of a batch's entries within a group.
    for (const [index, entry] of outgoing.entries()) {
      const id = ids[index]!;
      try {
        const { messageId, sequence } = await this.#deliver(topic, this.#checked(topic, entry));
        successful.push({ Id: id, MessageId: messageId, SequenceNumber: sequence });
      } catch (error) {
        const fault = error instanceof SnsFault ? error : new SnsFault(500, 'InternalError', String(error));
        failed.push({ Id: id, Code: fault.code, Message: fault.message, SenderFault: String(fault.type === 'Sender') });
      }
    }
    return { Successful: successful, Failed: failed };
  }

  /** Refuses what SNS refuses in one message, whatever its neighbours. */
  #checked(topic: Topic, entry: Outgoing): Outgoing {
    if (entry.message === '') throw invalid('Invalid parameter: Empty message');
    const bytes = bytesOf(entry);
    if (bytes > MAX_MESSAGE_BYTES) throw invalid(`Invalid parameter: Message too long (${bytes} bytes, at most ${MAX_MESSAGE_BYTES})`);
    // https://docs.aws.amazon.com/sns/latest/dg/sns-message-attributes.html: names and data types; a Number must be a number.
    for (const [name, attribute] of Object.entries(entry.attributes)) {
      if (!/^[A-Za-z0-9_.-]{1,256}$/.test(name) || /^(aws\.|amazon\.)/i.test(name) || name.startsWith('.') || name.endsWith('.') || name.includes('..')) {
        throw invalidValue(`The message attribute name '${name}' is invalid.`);
      }
      const type = attribute.DataType.split('.')[0];
      if (type !== 'String' && type !== 'Number' && type !== 'Binary') throw invalidValue(`The message attribute '${name}' has an invalid message attribute type '${attribute.DataType}'.`);
      if (type === 'Number' && (attribute.StringValue === undefined || !Number.isFinite(Number(attribute.StringValue)) || attribute.StringValue.trim() === '')) {
        throw invalidValue(`The message attribute '${name}' with type 'Number' must be a valid number.`);
      }
      if (type !== 'Binary' && attribute.StringValue === undefined) throw invalidValue(`The message attribute '${name}' must contain non-empty message attribute value.`);
    }
    // https://docs.aws.amazon.com/sns/latest/api/API_Publish.html: MessageGroupId is required for FIFO topics;
    // MessageDeduplicationId unless ContentBasedDeduplication is on.
    if (topic.fifo) {
      if (entry.groupId === undefined) throw invalid('Invalid parameter: The MessageGroupId parameter is required for FIFO topics');
      if (entry.dedupId === undefined && !topic.contentBasedDeduplication) {
        throw invalid('Invalid parameter: The topic should either have ContentBasedDeduplication enabled or MessageDeduplicationId provided explicitly');
      }
      for (const [what, value] of [['MessageGroupId', entry.groupId], ['MessageDeduplicationId', entry.dedupId]] as const) {
        if (value !== undefined && !/^[\x21-\x7E]{1,128}$/.test(value)) throw invalidValue(`Invalid parameter: ${what} must be 1-128 alphanumeric or punctuation characters`);
      }
    } else if (entry.dedupId !== undefined) {
      throw invalid('Invalid parameter: MessageDeduplicationId Reason: The request includes MessageDeduplicationId parameter that is not valid for this topic type');
    }
    return entry;
  }

  /**
   * Delivers to every SQS subscription of the topic, then answers. FIFO
   * (https://docs.aws.amazon.com/sns/latest/dg/fifo-message-dedup.html): a de-duplication id
   * (given, or the SHA-256 of the body with ContentBasedDeduplication) seen within 5 minutes
   * is accepted and not delivered again; group and de-duplication ids travel on to the
   * queues, which de-duplicate too.
   */
  async #deliver(topic: Topic, entry: Outgoing): Promise<{ messageId: string; sequence?: string }> {
    let dedupId = entry.dedupId;
    let sequence: string | undefined;
    if (topic.fifo) {
      dedupId ??= createHash('sha256').update(entry.message, 'utf8').digest('hex');
      const now = Date.now();
      for (const [id, seen] of topic.dedup) if (seen.expires <= now) topic.dedup.delete(id);
      const seen = topic.dedup.get(dedupId);
      if (seen !== undefined) return { messageId: seen.messageId, sequence: seen.sequence };
      topic.sequence += 1n;
      sequence = topic.sequence.toString();
    }
    const messageId = randomUUID();
    const subscriptions = [...this.#subscriptions.values()].filter((subscription) => subscription.topicArn === topic.arn);
    await Promise.all(subscriptions.map((subscription) => this.#deliverTo(subscription, topic, { ...entry, ...optional('dedupId', dedupId) }, messageId, sequence)));
    // Remembered only once delivered: a failed call is retried by the publisher and must then be delivered.
    if (topic.fifo) topic.dedup.set(dedupId!, { expires: Date.now() + DEDUP_WINDOW_MS, messageId, sequence: sequence! });
    return { messageId, ...optional('sequence', sequence) };
  }

  async #deliverTo(subscription: SnsSubscription, topic: Topic, entry: Outgoing, messageId: string, sequence: string | undefined): Promise<void> {
    const raw = subscription.attributes['RawMessageDelivery'] === 'true';
    const discard = (reason: string) => this.discarded.push({ subscriptionArn: subscription.arn, messageId, reason });
    if (raw && Object.keys(entry.attributes).length > RAW_SQS_MAX_ATTRIBUTES) {
      discard(`more than ${RAW_SQS_MAX_ATTRIBUTES} message attributes for a raw SQS subscription`);
      return;
    }
    let body: string;
    let attributes: Record<string, MessageAttributeValue> = {};
    if (raw) {
      // Raw delivery: the message as is, its attributes as the SQS message's attributes.
      body = entry.message;
      for (const [name, attribute] of Object.entries(entry.attributes)) {
        attributes[name] = attribute.BinaryValue !== undefined ? { DataType: attribute.DataType, BinaryValue: attribute.BinaryValue } : { DataType: attribute.DataType, StringValue: attribute.StringValue! };
      }
    } else {
      // https://docs.aws.amazon.com/sns/latest/dg/sns-message-and-json-formats.html: the notification document (unsigned here).
      body = JSON.stringify({
        Type: 'Notification',
        MessageId: messageId,
        ...(sequence !== undefined ? { SequenceNumber: sequence } : {}),
        TopicArn: topic.arn,
        ...(entry.subject !== undefined ? { Subject: entry.subject } : {}),
        Message: entry.message,
        Timestamp: new Date().toISOString(),
        SignatureVersion: '1',
        UnsubscribeURL: `http://127.0.0.1:${this.port}/?Action=Unsubscribe&SubscriptionArn=${encodeURIComponent(subscription.arn)}`,
        ...(Object.keys(entry.attributes).length > 0
          ? { MessageAttributes: Object.fromEntries(Object.entries(entry.attributes).map(([name, attribute]) => [name, { Type: attribute.DataType, Value: attribute.StringValue ?? attribute.BinaryValue?.toString('base64') }])) }
          : {}),
      });
      attributes = {};
    }
    const url = await this.#queueUrl(subscription.endpoint);
    if (url === undefined) {
      discard(`queue '${subscription.endpoint}' does not exist`);
      return;
    }
    const fifoQueue = subscription.endpoint.endsWith('.fifo');
    try {
      await this.#sqs.send(
        new SendMessageCommand({
          QueueUrl: url,
          MessageBody: body,
          ...(Object.keys(attributes).length > 0 ? { MessageAttributes: attributes } : {}),
          ...(fifoQueue ? { MessageGroupId: entry.groupId!, MessageDeduplicationId: entry.dedupId! } : {}),
        }),
      );
    } catch (error) {
      if (isMissingQueue(error)) {
        this.#queueUrls.delete(subscription.endpoint);
        discard(`queue '${subscription.endpoint}' does not exist`);
        return;
      }
      throw new SnsFault(500, 'InternalError', `delivery to '${subscription.endpoint}' failed: ${error instanceof Error ? error.message : String(error)}`);
    }
  }

  /** The URL of a queue ARN's queue (its last segment is the name), or undefined when it does not exist. */
  async #queueUrl(arn: string): Promise<string | undefined> {
    const known = this.#queueUrls.get(arn);
    if (known !== undefined) return known;
    try {
      const url = (await this.#sqs.send(new GetQueueUrlCommand({ QueueName: arn.split(':').at(-1)! }))).QueueUrl;
      if (url !== undefined) this.#queueUrls.set(arn, url);
      return url;
    } catch (error) {
      if (isMissingQueue(error)) return undefined;
      throw new SnsFault(500, 'InternalError', `looking up queue '${arn}' failed: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
}

function isMissingQueue(error: unknown): boolean {
  const name = (error as { name?: string } | undefined)?.name ?? '';
  return name === 'QueueDoesNotExist' || name.includes('NonExistentQueue');
}

/** Bytes SNS counts for a message: the body plus each attribute's name, type and value. */
function bytesOf(entry: Outgoing): number {
  let bytes = Buffer.byteLength(entry.message, 'utf8');
  for (const [name, attribute] of Object.entries(entry.attributes)) {
    bytes += Buffer.byteLength(name) + Buffer.byteLength(attribute.DataType) + (attribute.BinaryValue?.length ?? Buffer.byteLength(attribute.StringValue ?? ''));
  }
  return bytes;
}

function optional<K extends string, V>(key: K, value: V | undefined): { [P in K]?: V } {
  return (value === undefined ? {} : { [key]: value }) as { [P in K]?: V };
}
