// Types of @prosody-events/prosody.

export type JSONValue = null | boolean | number | string | JSONValue[] | { [key: string]: JSONValue };

/** `T` itself when every part of it has a JSON form, so an interface with no index signature is
 * accepted; a part without one (a function, `undefined`, a `bigint`, a `symbol`, a `Date`'s methods)
 * becomes `never`, so `payload: P & JsonCompatible<P>` refuses it at compile time. Optional fields
 * may be absent. Nothing is checked at run time. */
export type JsonCompatible<T> =
  T extends string | number | boolean | null ? T
    : T extends undefined | bigint | symbol | ((...args: never[]) => unknown) ? never
      : T extends readonly (infer E)[] ? readonly JsonCompatible<E>[]
        : T extends object ? { readonly [K in keyof T]: JsonCompatible<T[K]> }
          : never;

export declare const Mode: {
  readonly Pipeline: 'pipeline';
  readonly LowLatency: 'low-latency';
  readonly BestEffort: 'best-effort';
};
export type Mode = (typeof Mode)[keyof typeof Mode];

export declare const ConsumerState: {
  readonly Unconfigured: 'unconfigured';
  readonly Configured: 'configured';
  readonly Running: 'running';
  readonly ConfigurationFailed: 'configuration-failed';
  /** After `shutdown()`. */
  readonly Shutdown: 'shut-down';
};
export type ConsumerState = (typeof ConsumerState)[keyof typeof ConsumerState];

/** Options: every option of the configuration reference, camelCase; durations in milliseconds
 * (`...Ms`; `idempotenceTtlS` and `cassandraRetentionSeconds` in seconds) or as text ("5m").
 * `null`/`undefined` leaves an option unset (it falls back to its PROSODY_* variable);
 * `probePort: null` disables the probe server. */
export interface Configuration {
  bootstrapServers?: string | string[] | null;
  groupId?: string | null;
  subscribedTopics?: string | string[] | null;
  allowedEvents?: string | string[] | null;
  sourceSystem?: string | null;
  mock?: boolean | null;
  mode?: Mode | null;
  maxConcurrency?: number | null;
  maxUncommitted?: number | null;
  timeoutMs?: number | string | null;
  commitIntervalMs?: number | string | null;
  pollIntervalMs?: number | string | null;
  shutdownTimeoutMs?: number | string | null;
  stallThresholdMs?: number | string | null;
  probePort?: number | null;
  failureTopic?: string | null;
  partitionAssignmentStrategy?: 'cooperative-sticky' | 'range' | 'roundrobin' | null;
  groupProtocol?: 'classic' | 'consumer' | null;
  kafkaSecurityProtocol?: 'PLAINTEXT' | 'SSL' | 'SASL_PLAINTEXT' | 'SASL_SSL' | null;
  kafkaSaslMechanism?: 'PLAIN' | 'SCRAM-SHA-256' | 'SCRAM-SHA-512' | 'OAUTHBEARER' | null;
  kafkaSaslUsername?: string | null;
  kafkaSaslPassword?: string | null;
  kafkaSaslOauthbearerTokenEndpointUrl?: string | null;
  kafkaSaslOauthbearerClientId?: string | null;
  kafkaSaslOauthbearerClientSecret?: string | null;
  kafkaSaslOauthbearerScope?: string | null;
  kafkaSslCaLocation?: string | null;
  kafkaSslCertificateLocation?: string | null;
  kafkaSslKeyLocation?: string | null;
  kafkaSslKeyPassword?: string | null;
  kafkaSslEndpointIdentification?: boolean | null;
  /** librdkafka `name=value` properties for every Kafka handle. */
  kafkaProperties?: string | string[] | null;
  idempotenceCacheSize?: number | null;
  idempotenceVersion?: string | null;
  idempotenceTtlS?: number | string | null;
  slabSizeMs?: number | string | null;
  messageSpans?: 'child' | 'follows_from' | null;
  timerSpans?: 'child' | 'follows_from' | null;
  sendTimeoutMs?: number | string | null;
  maxRetries?: number | null;
  retryBaseMs?: number | string | null;
  maxRetryDelayMs?: number | string | null;
  deferEnabled?: boolean | null;
  deferBaseMs?: number | string | null;
  deferMaxDelayMs?: number | string | null;
  deferFailureThreshold?: number | null;
  deferFailureWindowMs?: number | string | null;
  loaderCacheSize?: number | null;
  /** The old name of `loaderCacheSize` (both at once are refused). */
  deferCacheSize?: number | null;
  deferStoreCacheSize?: number | null;
  loaderSeekTimeoutMs?: number | string | null;
  loaderDiscardThreshold?: number | null;
  /** The old names of `loaderSeekTimeoutMs` and `loaderDiscardThreshold`. */
  deferSeekTimeoutMs?: number | string | null;
  deferDiscardThreshold?: number | null;
  monopolizationEnabled?: boolean | null;
  monopolizationThreshold?: number | null;
  monopolizationWindowMs?: number | string | null;
  monopolizationCacheSize?: number | null;
  schedulerFailureWeight?: number | null;
  schedulerMaxWaitMs?: number | string | null;
  schedulerWaitWeight?: number | null;
  schedulerCacheSize?: number | null;
  telemetryTopic?: string | null;
  telemetryEnabled?: boolean | null;
  cassandraNodes?: string | string[] | null;
  cassandraKeyspace?: string | null;
  cassandraUser?: string | null;
  cassandraPassword?: string | null;
  cassandraSsl?: boolean | null;
  cassandraSslCaLocation?: string | null;
  cassandraSslCertificateLocation?: string | null;
  cassandraSslKeyLocation?: string | null;
  cassandraSslKeyPassword?: string | null;
  cassandraDatacenter?: string | null;
  cassandraRack?: string | null;
  cassandraRetentionSeconds?: number | string | null;
  topicPartitions?: number | null;
  topicReplicationFactor?: number | null;
  topicCleanupPolicy?: string | null;
  topicRetentionMs?: number | string | null;
  log?: string | null;
  /** This service's name for published keyed state (1 to 64 bytes, trimmed): required when a
   * collection of `stateCollections` is `published`; readers name it in `client.state()`. */
  subsystem?: string | null;
  /** How long readers of published state (`client.state()`) keep an answer: `{ ttlMs }` (default
   * 5 s), `{ disabled: true }` to read the store every time, or the text form (`"5s"`, `"none"`).
   * Giving both fields is a `RangeError`. A definition's own `readCache` wins. */
  stateReadCache?: ReadCacheOptions | string | null;
  /** Bytes of answers readers of published state keep (`"64 MiB"`, `"500 MB"`, or a number of bytes);
   * default `stateOwnedCacheSize`, else 1 MiB. */
  stateReadCacheSize?: string | number | null;
  /** The original's local cache of owned state: accepted and checked (a size), not used. */
  stateOwnedCacheSize?: string | number | null;
  /** The original's local state cache directory: accepted and checked, nothing is written there. */
  stateCacheDir?: string | null;
  /** Whole seconds in 1..=31536000 (default 30): the original's repair delay; accepted and checked,
   * not used. */
  stateRecoveryDelaySeconds?: number | string | null;
  /** The keyed-state collections handlers may open with `context.state()` (README "Keyed state"):
   * definitions made by `value()`, `map()`, `deque()`, or plain objects of the same shape. Names are
   * unique; checked when the client is made. A client's option only (`AdminClient` refuses it). */
  stateCollections?: readonly StateCollectionConfig[] | null;
}

/** Where a client's log lines go: any object with these four methods, such as `console`, pino or
 * winston. Each is called on the JavaScript thread with one string,
 * `"prosody::<subsystem>: <message>"`: `error`, `warn`, `info` and `debug` for libprosody's levels of
 * the same names, `debug` for TRACE too. Which lines come is the `log` option. */
export interface Logger {
  error(message: string): void;
  warn(message: string): void;
  info(message: string): void;
  debug(message: string): void;
}

/** A ProsodyClient's options: those of the configuration reference and `logger`. */
export interface ClientConfiguration extends Configuration {
  /** The client's log lines go to this logger; unset or `null`: libprosody writes them to standard
   * error (`2026-01-01T00:00:00.000Z WARN  prosody::producer: ...`). */
  logger?: Logger | null;
  /** Checked (host:port), not used yet: requests are not served. */
  peerBindAddress?: string | null;
}

/** `offset` is a `number` for a client made with `new ProsodyClient()` and a `bigint` for one
 * made with `await ProsodyClient.create()` (the package README: "Two contracts"). `P` types the
 * parsed payload for the compiler only (nothing checks it at run time); unset, it is `JsonValue`. */
export interface Message<P = JsonValue> {
  readonly topic: string;
  readonly partition: number;
  readonly offset: number | bigint;
  readonly timestamp: Date;
  readonly key: string;
  readonly payload: P;
}

/** An excise record: a key with no value (a Kafka tombstone), delivered to `onExcise`. */
export interface ExciseMessage {
  readonly topic: string;
  readonly partition: number;
  readonly offset: number | bigint;
  readonly timestamp: Date;
  readonly key: string;
}

export interface Timer {
  readonly key: string;
  readonly time: Date;
}

export declare class Context {
  /** True once the event should stop (timeout, revoke, shutdown) or its handler finished. */
  readonly shouldCancel: boolean;
  /** Resolves when the event is cancelled or its handler has finished. */
  onCancel(): Promise<void>;
  schedule(time: Date): Promise<void>;
  clearAndSchedule(time: Date): Promise<void>;
  unschedule(time: Date): Promise<void>;
  clearScheduled(): Promise<void>;
  scheduled(): Promise<Date[]>;
  /** The handle of a registered keyed-state collection for this event's key (the same one for the
   * same definition within the event), valid until the handler finishes. Throws
   * `PermanentStateError` for a name not in `stateCollections` (or registered with another kind),
   * `TransientStateError` for an object not made by a definition constructor. */
  state<P>(definition: MessageValueDefinition<P>): ValueState<Message<P>>;
  state<P>(definition: MessageMapDefinition<P>): MapState<Message<P>>;
  state<P>(definition: MessageDequeDefinition<P>): DequeState<Message<P>>;
  state<T>(definition: ValueDefinition<T>): ValueState<T>;
  state<V>(definition: MapDefinition<V>): MapState<V>;
  state<T>(definition: DequeDefinition<T>): DequeState<T>;
}

// ---------------------------------------------------------------------------
// Keyed state

export type JsonValue = JSONValue;
export type ScanDirection = 'forward' | 'backward';

export interface StateDefinitionOptions {
  /** Seconds each cell lives after its last write: a whole number in 1..=630720000. */
  ttlSeconds?: number;
  /** Writes go to the store at once instead of with the event's success (make them idempotent). */
  readUncommitted?: boolean;
}
/** How long a reader of published state keeps an answer: `ttlMs` (milliseconds, at least 0;
 * 0 reads the store every time), or `disabled: true` (the same); not both. */
export interface ReadCacheOptions {
  ttlMs?: number;
  disabled?: boolean;
}
export interface PublishedStateDefinitionOptions extends StateDefinitionOptions {
  /** Readable by other services through `client.state(subsystem, definition)`; the client
   * registering it needs the `subsystem` option. */
  published?: boolean;
  /** Reader side (`client.state()`): how long answers are kept; `false` reads the store every
   * time. Unset: the reading client's `stateReadCache`. */
  readCache?: ReadCacheOptions | false;
}
export interface MapDefinitionOptions extends PublishedStateDefinitionOptions {
  /** 0..=4096 (default 128). */
  keysetLimit?: number;
}
export interface DequeDefinitionOptions extends PublishedStateDefinitionOptions {
  /** At most this many items: a push drops from the other end. */
  capacity?: number;
}
export interface MessageMapDefinitionOptions extends StateDefinitionOptions {
  keysetLimit?: number;
}
export interface MessageDequeDefinitionOptions extends StateDefinitionOptions {
  capacity?: number;
}

/** A collection's registration, as `stateCollections` takes it. */
export interface StateCollectionConfig {
  name: string;
  kind: string;
  payload: string;
  ttlSeconds?: number;
  readUncommitted?: boolean;
  published?: boolean;
  readCache?: ReadCacheOptions | false;
  keysetLimit?: number;
  capacity?: number;
}

/** Keys of type-only fields of definitions; no definition object has them. */
declare const madeByConstructor: unique symbol;
declare const itemType: unique symbol;

/** A definition made by `value()`, `map()`, ...: `context.state()` and `client.state()` take only
 * these (a plain object is a compile error here and a `TransientStateError` / `TypeError` at run
 * time), while `stateCollections` also takes plain objects of the same shape. */
interface StateDefinitionBase<K extends 'value' | 'map' | 'deque', P extends 'json' | 'message'> {
  readonly [madeByConstructor]: true;
  readonly name: string;
  readonly kind: K;
  readonly payload: P;
  readonly ttlSeconds?: number;
  readonly readUncommitted?: boolean;
}
export interface ValueDefinition<T = JsonValue> extends StateDefinitionBase<'value', 'json'> {
  readonly published?: boolean;
  readonly readCache?: ReadCacheOptions | false;
  /** Type only: the stored item's type. */
  readonly [itemType]?: T;
}
export interface MapDefinition<V = JsonValue> extends StateDefinitionBase<'map', 'json'> {
  readonly published?: boolean;
  readonly readCache?: ReadCacheOptions | false;
  readonly keysetLimit?: number;
  readonly [itemType]?: V;
}
export interface DequeDefinition<T = JsonValue> extends StateDefinitionBase<'deque', 'json'> {
  readonly published?: boolean;
  readonly readCache?: ReadCacheOptions | false;
  readonly capacity?: number;
  readonly [itemType]?: T;
}
/** Message collections keep Kafka messages this package delivered to a handler (the current one, or
 * one read back from a message collection) by their topic, partition and offset, and give back
 * `Message`s loaded again from Kafka (a record Kafka no longer has: `PermanentStateError`). Any other
 * object is refused with a `TransientStateError`, and so is a delivered message written to a JSON
 * collection. */
export interface MessageValueDefinition<P = JsonValue> extends StateDefinitionBase<'value', 'message'> {
  readonly [itemType]?: P;
}
export interface MessageMapDefinition<P = JsonValue> extends StateDefinitionBase<'map', 'message'> {
  readonly keysetLimit?: number;
  readonly [itemType]?: P;
}
export interface MessageDequeDefinition<P = JsonValue> extends StateDefinitionBase<'deque', 'message'> {
  readonly capacity?: number;
  readonly [itemType]?: P;
}

export declare function value<T = JsonValue>(name: string, options?: PublishedStateDefinitionOptions): ValueDefinition<T>;
export declare function map<V = JsonValue>(name: string, options?: MapDefinitionOptions): MapDefinition<V>;
export declare function deque<T = JsonValue>(name: string, options?: DequeDefinitionOptions): DequeDefinition<T>;
export declare function messageValue<P = JsonValue>(name: string, options?: StateDefinitionOptions): MessageValueDefinition<P>;
export declare function messageMap<P = JsonValue>(name: string, options?: MessageMapDefinitionOptions): MessageMapDefinition<P>;
export declare function messageDeque<P = JsonValue>(name: string, options?: MessageDequeDefinitionOptions): MessageDequeDefinition<P>;

/** Every method's writes are buffered until the handler succeeds (unless `readUncommitted`). */
interface StateHandle {
  /** Removes everything. */
  clear(): Promise<void>;
  /** Makes this collection's buffered writes durable now. */
  commit(): Promise<void>;
  /** Drops this collection's writes buffered since the last commit. */
  rollback(): Promise<void>;
}
export declare class ValueState<T = JsonValue> implements StateHandle {
  private constructor();
  get(): Promise<T | null>;
  set(value: NonNullable<T>): Promise<void>;
  clear(): Promise<void>;
  commit(): Promise<void>;
  rollback(): Promise<void>;
}
export declare class MapState<V = JsonValue> implements StateHandle {
  private constructor();
  get(key: string): Promise<V | null>;
  getMany(keys: readonly string[]): Promise<(V | null)[]>;
  has(key: string): Promise<boolean>;
  set(key: string, value: NonNullable<V>): Promise<void>;
  delete(key: string): Promise<void>;
  clear(): Promise<void>;
  commit(): Promise<void>;
  rollback(): Promise<void>;
  /** In key order (UTF-8 bytes), in chunks of up to 256. */
  entries(direction?: ScanDirection): AsyncIterableIterator<[string, V]>;
  keys(direction?: ScanDirection): AsyncIterableIterator<string>;
  values(direction?: ScanDirection): AsyncIterableIterator<V>;
  [Symbol.asyncIterator](): AsyncIterableIterator<[string, V]>;
}
export declare class DequeState<T = JsonValue> implements StateHandle {
  private constructor();
  push(item: NonNullable<T>): Promise<void>;
  unshift(item: NonNullable<T>): Promise<void>;
  pop(): Promise<T | null>;
  shift(): Promise<T | null>;
  /** `Array.prototype.at`'s rules; out of range: null. */
  at(index: number): Promise<T | null>;
  length(): Promise<number>;
  isEmpty(): Promise<boolean>;
  clear(): Promise<void>;
  commit(): Promise<void>;
  rollback(): Promise<void>;
  values(direction?: ScanDirection): AsyncIterableIterator<T>;
  [Symbol.asyncIterator](): AsyncIterableIterator<T>;
}

/** A reader of a collection another service publishes (`client.state(subsystem, definition)`):
 * its committed state, by Kafka key, at most as stale as the read cache's ttl. Reads reject with
 * `TransientStateError` (the store, a bad argument) or `PermanentStateError` (the collection is
 * published with another kind). A key nobody wrote reads as empty. */
export declare class PublishedValue<T = JsonValue> {
  private constructor();
  readonly subsystem: string;
  readonly name: string;
  get(key: string): Promise<T | null>;
}
export declare class PublishedMap<V = JsonValue> {
  private constructor();
  readonly subsystem: string;
  readonly name: string;
  get(key: string, mapKey: string): Promise<V | null>;
  getMany(key: string, mapKeys: readonly string[]): Promise<(V | null)[]>;
  has(key: string, mapKey: string): Promise<boolean>;
  /** Lazy: nothing is read before the first `next()`; then pages of up to 256. */
  entries(key: string, direction?: ScanDirection): AsyncIterableIterator<[string, V]>;
  keys(key: string, direction?: ScanDirection): AsyncIterableIterator<string>;
  values(key: string, direction?: ScanDirection): AsyncIterableIterator<V>;
}
export declare class PublishedDeque<T = JsonValue> {
  private constructor();
  readonly subsystem: string;
  readonly name: string;
  length(key: string): Promise<number>;
  isEmpty(key: string): Promise<boolean>;
  /** `Array.prototype.at`'s rules; out of range: null. */
  at(key: string, index: number): Promise<T | null>;
  values(key: string, direction?: ScanDirection): AsyncIterableIterator<T>;
}

/** With `new ProsodyClient()` every method is optional (a missing `onExcise`: excise records are
 * committed past unhandled); with `await ProsodyClient.create()` all three are required. */
export interface EventHandler<P = JsonValue> {
  onMessage?: (context: Context, message: Message<P>, signal: AbortSignal) => Promise<unknown> | unknown;
  onExcise?: (context: Context, message: ExciseMessage, signal: AbortSignal) => Promise<unknown> | unknown;
  onTimer?: (context: Context, timer: Timer, signal: AbortSignal) => Promise<void> | void;
}

export declare class ProsodyClient {
  /** The 0.1 contract (see the README); `ProsodyClient.create()` gives the current one. */
  constructor(config?: ClientConfiguration);
  /** Makes the client off the event loop, with the current API's contract. */
  static create(config?: ClientConfiguration): Promise<ProsodyClient>;
  readonly sourceSystem: string;
  /** The probe server's port while subscribed, or null. */
  readonly probePort: number | null;
  /** `payload` is sent as its JSON text; its type must have a JSON form (`JsonCompatible`). */
  send<P>(topic: string, key: string, payload: P & JsonCompatible<P>, signal?: AbortSignal): Promise<void>;
  /** Sends an excise record: `key` with no value (a tombstone). */
  excise(topic: string, key: string, signal?: AbortSignal): Promise<void>;
  /** `P` types the payloads `onMessage` receives (compile time only). */
  subscribe<P = JsonValue>(eventHandler: EventHandler<P>): Promise<void>;
  unsubscribe(): Promise<void>;
  /** Stops consuming, waits for the records being sent, and refuses every later call; repeated
   * calls share one promise. */
  shutdown(): Promise<void>;
  consumerState(): Promise<ConsumerState>;
  assignedPartitionCount(): Promise<number>;
  isStalled(): Promise<boolean>;
  /** A reader of the collection `definition` names as published by service `subsystem`; any
   * client (no group or subscription needed). The same subsystem and definition (name, kind,
   * `readCache`) give the same reader, which lives as long as the client. A message definition
   * (or an object not made by `value()`, `map()`, `deque()`) rejects with `TypeError`. */
  state<T>(subsystem: string, definition: ValueDefinition<T>): Promise<PublishedValue<T>>;
  state<V>(subsystem: string, definition: MapDefinition<V>): Promise<PublishedMap<V>>;
  state<T>(subsystem: string, definition: DequeDefinition<T>): Promise<PublishedDeque<T>>;
}

export interface TopicOptions {
  partitionCount?: number;
  replicationFactor?: number;
  cleanupPolicy?: string;
  /** Milliseconds. */
  retention?: number;
}

export declare class AdminClient {
  constructor(config: string | Omit<Configuration, 'stateCollections'>);
  createTopic(name: string, partitionCount?: number, replicationFactor?: number): Promise<void>;
  createTopic(name: string, options: TopicOptions): Promise<void>;
  deleteTopic(name: string): Promise<void>;
}

export declare class EventHandlerError extends Error {
  constructor(message?: string, options?: { cause?: unknown });
  readonly isPermanent: boolean;
}
export declare class TransientError extends EventHandlerError {
  readonly isPermanent: false;
}
export declare class PermanentError extends EventHandlerError {
  readonly isPermanent: true;
}
/** A keyed-state failure worth retrying: the store, a stale handle, a bad argument or write. */
export declare class TransientStateError extends TransientError {
  readonly code?: string;
}
/** A keyed-state failure a retry cannot fix: an unregistered collection, another kind. */
export declare class PermanentStateError extends PermanentError {
  readonly code?: string;
}
/** By `name`: also true for the state errors of another copy of the package. */
export declare function isStateError(error: unknown): error is PermanentStateError | TransientStateError;
export declare class ProsodyError extends Error {
  constructor(message: string, code: string);
  readonly code: string;
}
export declare class ProsodyTransientError extends TransientError {
  readonly code: string;
}
export declare class ProsodyPermanentError extends PermanentError {
  readonly code: string;
}

type ErrorClass = abstract new (...args: any[]) => Error;
type Method = (this: any, ...args: any[]) => any;
/** Classifies the listed error classes (all, when none is listed) thrown by the decorated
 * method as permanent: a TC39 (2023-05) method decorator, also usable as a plain wrapper. */
export declare function permanent(...errors: ErrorClass[]): <F extends Method>(fn: F, context?: ClassMethodDecoratorContext) => F;
export declare function transient(...errors: ErrorClass[]): <F extends Method>(fn: F, context?: ClassMethodDecoratorContext) => F;

export declare function libraryVersion(): string;

/** Exports every span ended so far, in every client, and waits (at most 30 s; throws after). */
export declare function flushTelemetry(): void;
/** Stops tracing for the process (no span starts afterwards), then flushes as `flushTelemetry`. */
export declare function shutdownTelemetry(): void;
