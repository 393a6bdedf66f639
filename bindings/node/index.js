'use strict';
// @prosody-events/prosody: the JavaScript API of Prosody over libprosody.
//
// The addon (src/*.c: bridge.c) hands every batch of events from libprosody's
// engine thread to `dispatch` below, on the JavaScript thread; this file
// turns them into handler calls with a Context, a Message or Timer and an
// AbortSignal, and reports each promise's outcome with `complete`.

const bindings = require('./bindings');

const native = bindings.native;

const Mode = Object.freeze({
  Pipeline: 'pipeline',
  LowLatency: 'low-latency',
  BestEffort: 'best-effort',
});

const ConsumerState = Object.freeze({
  Unconfigured: 'unconfigured',
  Configured: 'configured',
  Running: 'running',
  ConfigurationFailed: 'configuration-failed',
  Shutdown: 'shut-down',
});

// ---------------------------------------------------------------------------
// Errors and their classification

class EventHandlerError extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }

  get isPermanent() {
    return false;
  }
}

class TransientError extends EventHandlerError {}

class PermanentError extends EventHandlerError {
  get isPermanent() {
    return true;
  }
}

// Failures of the client's own calls: `code` is the C error's name.
class ProsodyError extends Error {
  constructor(message, code) {
    super(message);
    this.name = new.target.name;
    this.code = code;
  }
}
class ProsodyTransientError extends TransientError {
  constructor(message, code) {
    super(message);
    this.code = code;
  }
}
class ProsodyPermanentError extends PermanentError {
  constructor(message, code) {
    super(message);
    this.code = code;
  }
}

// The addon rejects with an Error carrying `code` and `transient`; users get
// the class of the failure.
function classifyNative(e) {
  if (!e || typeof e.code !== 'string' || !e.code.startsWith('PROSODY_')) return e;
  switch (e.code) {
    case 'PROSODY_ERR_INVALID_ARG':
    case 'PROSODY_ERR_CONFIG':
    case 'PROSODY_ERR_INVALID_PAYLOAD':
      return e; // a RangeError with code
    case 'PROSODY_ERR_STATE':
    case 'PROSODY_ERR_UNSUPPORTED':
      return new ProsodyError(e.message, e.code);
    default:
      return e.transient
        ? new ProsodyTransientError(e.message, e.code)
        : new ProsodyPermanentError(e.message, e.code);
  }
}

function rethrow(e) {
  throw classifyNative(e);
}

// @permanent(TypeError, ...) / @transient(...): TC39 2023-05 method
// decorators (as Babel and TypeScript 5 emit them), and plain wrappers:
// permanent(TypeError)(fn).
function classifier(ErrorClass, types) {
  for (const t of types) {
    if (typeof t !== 'function') {
      throw new TypeError(`${ErrorClass === PermanentError ? 'permanent' : 'transient'}() expects error classes`);
    }
  }
  const matches = (e) => !(e instanceof EventHandlerError) &&
    (types.length === 0 || types.some((t) => e instanceof t));
  return function decorate(fn, context) {
    if (typeof fn !== 'function' || (context && context.kind && context.kind !== 'method')) {
      throw new TypeError('permanent/transient decorate methods or functions');
    }
    return async function classified(...args) {
      try {
        return await fn.apply(this, args);
      } catch (e) {
        if (!matches(e)) throw e;
        throw new ErrorClass(`${e && e.name ? e.name : 'Error'}: ${e && e.message}`, { cause: e });
      }
    };
  };
}

const permanent = (...types) => classifier(PermanentError, types);
const transient = (...types) => classifier(TransientError, types);

const RESULT = { success: 0, transient: 1, permanent: 2 };
const STRIDE = 13; // slots per event in a batch from the addon

// [result, text] for a value a handler threw or rejected with. Any value
// will do, including one that throws when looked at (a Proxy, an object
// without a prototype, an Error whose `name` getter throws): it is a
// transient failure unless it is a PermanentError, and the text is the best
// description that can be had without an exception escaping.
function outcome(e) {
  let permanentFailure = false;
  try {
    permanentFailure = e instanceof EventHandlerError && Boolean(e.isPermanent);
  } catch (ignored) {
    permanentFailure = false;
  }
  return [permanentFailure ? RESULT.permanent : RESULT.transient, describeThrown(e)];
}

function describeThrown(e) {
  try {
    const shown = e instanceof EventHandlerError && e.cause instanceof Error ? e.cause : e;
    if (shown instanceof Error) return `${String(shown.name)}: ${String(shown.message)}`;
    return `thrown: ${String(shown)}`;
  } catch (ignored) {
    // Described below from its type alone.
  }
  try {
    return `thrown: ${Object.prototype.toString.call(e)} (it cannot be converted to a string)`;
  } catch (ignored) {
    return `thrown: a ${typeof e} that cannot be described`;
  }
}

// What a handler returned that is neither a promise (a thenable) nor a
// plain value: an object whose work runs only when it is iterated, which
// prosody never does. Null when the value is fine. May throw (a Proxy).
function lazyKind(v) {
  if (v === null || (typeof v !== 'object' && typeof v !== 'function')) return null;
  const tag = Object.prototype.toString.call(v);
  if (tag === '[object AsyncGenerator]') return 'an async generator';
  if (tag === '[object Generator]') return 'a generator';
  if (typeof v.next === 'function' && typeof v[Symbol.asyncIterator] === 'function') return 'an async iterator';
  return null;
}

// "MyHandler.onMessage", or "handler.onMessage" for a plain object.
function handlerMethodName(handler, method) {
  let cls = null;
  try {
    cls = handler && handler.constructor && handler.constructor.name;
  } catch (ignored) {
    cls = null;
  }
  return `${typeof cls === 'string' && cls && cls !== 'Object' ? cls : 'handler'}.${method}`;
}

// ---------------------------------------------------------------------------
// Options: camelCase names of the spec, converted to libprosody's text form
// and validated by its option table (one source of truth).

const OPTION_TABLE = native.options();
const SECONDS = {
  idempotence_ttl: 'idempotenceTtlS',
  cassandra_retention: 'cassandraRetentionSeconds',
  state_recovery_delay: 'stateRecoveryDelaySeconds',
};
// Options libprosody takes in whole seconds only, with their bound: a number
// given for one is checked here, so a fraction, NaN or Infinity is refused
// as the original refuses it, not converted to microseconds first.
const WHOLE_SECONDS = { state_recovery_delay: 365 * 86400 };
const JS_NAMES = new Map(); // jsName -> [snake name, unit]
for (const [name, info] of Object.entries(OPTION_TABLE)) {
  const camel = name.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
  if (info.type === 'duration') {
    if (SECONDS[name]) JS_NAMES.set(SECONDS[name], [name, 's']);
    else JS_NAMES.set(`${camel}Ms`, [name, 'ms']);
  } else {
    JS_NAMES.set(camel, [name, null]);
  }
  // A renamed option keeps its old name (deferCacheSize for loaderCacheSize):
  // libprosody takes either, and refuses both at once.
  if (info.alias) {
    const old = info.alias.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
    JS_NAMES.set(info.type === 'duration' ? `${old}Ms` : old, [info.alias, info.type === 'duration' ? 'ms' : null]);
  }
}

// state_read_cache is an object in JavaScript, as the original has it:
// stateReadCache: { ttlMs?, disabled? } (or the text form, "5s", "none").
JS_NAMES.delete('stateReadCacheMs');
JS_NAMES.set('stateReadCache', ['state_read_cache', 'readCache']);

// An integral number in full digits: String(1e21) is "1e+21", which the
// option table would call "not an integer" rather than out of range.
const digits = (n) => (Number.isSafeInteger(n) ? String(n) : BigInt(n).toString());

// The text form of a NUL-free string: libprosody's options are C strings, so
// a NUL would silently cut the value short.
function noNul(jsName, text) {
  const at = text.indexOf('\0');
  if (at >= 0) {
    throw new RangeError(`option ${jsName}: the value contains a NUL character (\\0) at index ${at}; ` +
                         'an option cannot hold one');
  }
  return text;
}

// An option's table entry by its name or its old name.
const BY_ALIAS = new Map(Object.entries(OPTION_TABLE).filter(([, i]) => i.alias).map(([n, i]) => [i.alias, n]));

function optionText(jsName, name, unit, value) {
  const info = OPTION_TABLE[name] || OPTION_TABLE[BY_ALIAS.get(name)];
  const got = () => {
    if (Array.isArray(value)) return 'array';
    // A number given to a text option (a password) is never echoed.
    if (typeof value === 'number' && ['integer', 'number', 'duration', 'size'].includes(info.type)) {
      return Number.isNaN(value) ? 'NaN' : `${value}`;
    }
    return typeof value;
  };
  const bad = (what) => new TypeError(
    `option ${jsName}: expected ${what}${info.accepted ? ` (${info.accepted})` : ''}, got ${got()}`);
  if (typeof value === 'string') return noNul(jsName, value); // the text form, as in the environment
  switch (info.type) {
    case 'duration':
      if (WHOLE_SECONDS[name] && typeof value === 'number' &&
          !(Number.isInteger(value) && value >= 1 && value <= WHOLE_SECONDS[name])) {
        throw new RangeError(`option ${jsName}: must be a whole number in 1..=${WHOLE_SECONDS[name]}, got ${got()}`);
      }
      if (typeof value !== 'number' || Number.isNaN(value)) throw bad(unit === 's' ? 'seconds (a number)' : 'milliseconds (a number)');
      if (!Number.isFinite(value)) throw new RangeError(`option ${jsName}: ${value} is not a duration`);
      return unit === 's'
        ? (Number.isInteger(value) ? `${digits(value)}s` : `${digits(Math.round(value * 1e6))}us`)
        : (Number.isInteger(value) ? `${digits(value)}ms` : `${digits(Math.round(value * 1e3))}us`);
    case 'integer':
      if (typeof value !== 'number' || !Number.isInteger(value)) throw bad('an integer');
      return digits(value);
    case 'size': // a number of bytes, or the text form ("64 MiB")
      if (typeof value !== 'number' || !Number.isInteger(value)) throw bad('a size (a string, or a number of bytes)');
      return digits(value);
    case 'number':
      if (typeof value !== 'number' || Number.isNaN(value)) throw bad('a number');
      return String(value);
    case 'boolean':
      if (typeof value !== 'boolean') throw bad('a boolean');
      return value ? 'true' : 'false';
    default:
      if (info.type.includes('list') && Array.isArray(value)) {
        if (!value.every((v) => typeof v === 'string')) throw bad('a string or an array of strings');
        return noNul(jsName, value.join(','));
      }
      throw bad(info.type.includes('list') ? 'a string or an array of strings' : 'a string');
  }
}

function convertOptions(config, what) {
  if (config === undefined || config === null) config = {};
  if (typeof config !== 'object' || Array.isArray(config)) {
    throw new TypeError(`${what} takes an options object`);
  }
  const out = {};
  for (const [jsName, value] of Object.entries(config)) {
    const known = JS_NAMES.get(jsName);
    if (!known) {
      throw new RangeError(`unknown option '${jsName}' (options are camelCase, durations in milliseconds ` +
                           'with an Ms suffix; see the package README)');
    }
    const [name, unit] = known;
    if (value === undefined || value === null) {
      if (name === 'probe_port' && value === null) out[name] = 'none';
      continue;
    }
    const text = unit === 'readCache' ? readCacheText(jsName, value) : optionText(jsName, name, unit, value);
    if (text !== undefined) out[name] = text;
  }
  return out;
}

// The fields of a read cache's settings, { ttlMs?, disabled? } (the
// client's stateReadCache, a definition's readCache), checked but for the
// ttl's value; `at` names it in errors.
function readCacheFields(v, at) {
  if (v === null || typeof v !== 'object' || Array.isArray(v)) {
    throw new TypeError(`${at}: expected { ttlMs?: number, disabled?: boolean }, got ${shown(v)}`);
  }
  for (const field of Object.keys(v)) {
    if (field !== 'ttlMs' && field !== 'disabled') {
      throw new RangeError(`${at}: unknown field '${field}' (ttlMs, disabled)`);
    }
  }
  const { ttlMs, disabled } = v;
  if (disabled !== undefined && typeof disabled !== 'boolean') {
    throw new TypeError(`${at}.disabled: expected a boolean, got ${shown(disabled)}`);
  }
  if (ttlMs !== undefined && disabled !== undefined) throw new RangeError(`${at}: cannot set both ttlMs and disabled`);
  return { ttlMs, disabled };
}

// stateReadCache's text form for the option table (which checks the ttl):
// "none" when disabled, the ttl in milliseconds, or undefined (unset).
function readCacheText(jsName, value) {
  if (typeof value === 'string') return noNul(jsName, value);
  const { ttlMs, disabled } = readCacheFields(value, jsName);
  if (disabled) return 'none';
  return ttlMs === undefined ? undefined : optionText(`${jsName}.ttlMs`, 'state_read_cache', 'ms', ttlMs);
}

function wrapConfigError(e) {
  // libprosody names the snake_case option; add the JavaScript name.
  if (e && e.code === 'PROSODY_ERR_CONFIG' && typeof e.message === 'string' &&
      e.message.includes('(the old name of ')) {
    // Both names of a renamed option: say them as they were written.
    for (const [jsName, [name]] of JS_NAMES) {
      if (OPTION_TABLE[name] && OPTION_TABLE[name].alias || BY_ALIAS.has(name)) {
        e.message = e.message.split(name).join(jsName);
      }
    }
    return e;
  }
  // A published collection without the subsystem option: libprosody's
  // message names both (the option has one name in both languages).
  if (e && e.code === 'PROSODY_ERR_CONFIG' && typeof e.message === 'string' && !e.message.startsWith('published: ')) {
    for (const [jsName, [name]] of JS_NAMES) {
      if (e.message.includes(`option ${name} `) || e.message.startsWith(`${name}:`) ||
          e.message.includes(` ${name} (`)) {
        e.message = `option ${jsName}: ${e.message}`;
        break;
      }
    }
  }
  return e;
}

// ---------------------------------------------------------------------------
// Logging: the `logger` option (not libprosody's: its level is the `log`
// option). The addon gives each batch of the client's lines to `forward`.

const LOGGER_METHODS = ['error', 'warn', 'info', 'debug'];
// libprosody's levels (1 ERROR .. 5 TRACE) as methods; TRACE as debug
// (console.trace would print a stack).
const LEVEL_METHOD = [null, 'error', 'warn', 'info', 'debug', 'debug'];

// Takes `logger` out of the options: [options for the table, logger or null].
function splitLogger(config) {
  if (config === null || typeof config !== 'object' || Array.isArray(config) || !('logger' in config)) {
    return [config, null];
  }
  const { logger, ...rest } = config;
  if (logger === undefined || logger === null) return [rest, null];
  const missing = (typeof logger === 'object' || typeof logger === 'function')
    ? LOGGER_METHODS.filter((m) => typeof logger[m] !== 'function')
    : LOGGER_METHODS;
  if (missing.length) {
    throw new TypeError(`option logger: expected an object with ${LOGGER_METHODS.join(', ')} methods ` +
                        `(console, or a console-compatible logger); missing: ${missing.join(', ')}`);
  }
  return [rest, logger];
}

// The function the addon calls on the JavaScript thread with a batch of
// lines, [level, subsystem, message, ...], and how many were dropped.
function logForwarder(logger) {
  return (lines, dropped) => {
    for (let i = 0; i < lines.length; i += 3) {
      logger[LEVEL_METHOD[lines[i]] || 'info'](`prosody::${lines[i + 1]}: ${lines[i + 2]}`);
    }
    if (dropped) {
      logger.warn(`prosody: ${dropped} log line(s) dropped: the client logged faster than ` +
                  'the JavaScript thread forwarded them');
    }
  };
}

// ---------------------------------------------------------------------------
// OpenTelemetry (optional)

let otel = null;
try {
  otel = require('@opentelemetry/api');
} catch (e) {
  otel = null;
}

// Tracing costs about a tenth of the handler path: it is done only when an
// SDK has registered a tracer provider (the API alone traces nothing).
const NOOP_PROVIDER = otel ? new otel.ProxyTracerProvider().getDelegate() : null;
function tracing() {
  if (!otel) return false;
  const p = otel.trace.getTracerProvider();
  return (typeof p.getDelegate === 'function' ? p.getDelegate() : p) !== NOOP_PROVIDER;
}

function traceHeaders() {
  if (!tracing()) return [undefined, undefined, undefined];
  const carrier = {};
  otel.propagation.inject(otel.context.active(), carrier);
  return [carrier.traceparent, carrier.tracestate, carrier.baggage];
}

// Runs `fn` under a span for the event: a child of the record's context, or
// (followsFrom) the root of a new trace linked to it. Returns [result, span].
function withSpan(rec, followsFrom, fn) {
  if (!otel) return [fn(), null];
  const carrier = {};
  if (rec.traceparent) carrier.traceparent = rec.traceparent;
  if (rec.tracestate) carrier.tracestate = rec.tracestate;
  if (rec.baggage) carrier.baggage = rec.baggage;
  const extracted = otel.propagation.extract(otel.ROOT_CONTEXT, carrier);
  const tracer = otel.trace.getTracer('prosody');
  const attributes = rec.kind === 'message'
    ? {
        'messaging.system': 'kafka',
        'messaging.destination.name': rec.topic,
        'messaging.destination.partition.id': String(rec.partition),
        'messaging.kafka.message.offset': rec.offset,
        'messaging.kafka.message.key': rec.key,
      }
    : { 'messaging.system': 'kafka', 'prosody.timer.key': rec.key };
  const name = rec.kind === 'message' ? 'prosody.receive' : 'prosody.trigger';
  let span;
  if (followsFrom) {
    const parent = otel.trace.getSpanContext(extracted);
    span = tracer.startSpan(name, {
      kind: otel.SpanKind.CONSUMER, attributes,
      links: parent && otel.trace.isSpanContextValid(parent) ? [{ context: parent }] : [],
    }, otel.ROOT_CONTEXT);
  } else {
    span = tracer.startSpan(name, { kind: otel.SpanKind.CONSUMER, attributes }, extracted);
  }
  const ctx = otel.trace.setSpan(followsFrom ? otel.ROOT_CONTEXT : extracted, span);
  return [otel.context.with(ctx, fn), span];
}

// ---------------------------------------------------------------------------
// Keyed state: collection definitions, their registration and the handles
// context.state() gives (libprosody's prosody_state_*; README "Keyed state").

class TransientStateError extends TransientError {}
class PermanentStateError extends PermanentError {}

// By name, so that it also recognises the errors of another realm's copy.
function isStateError(error) {
  try {
    return error instanceof Error &&
      (error.name === 'TransientStateError' || error.name === 'PermanentStateError');
  } catch (ignored) {
    return false;
  }
}

const STATE_KINDS = { value: 0, map: 1, deque: 2 };
const STATE_PAYLOADS = { json: 0, message: 1 };
const STATE_FIELDS = ['name', 'kind', 'payload', 'ttlSeconds', 'readUncommitted', 'published', 'readCache',
                      'keysetLimit', 'capacity'];
const MAX_TTL_S = 630720000; // 20 years: libprosody's bound
const DEFINITIONS = new WeakMap(); // the definitions made by the constructors below
// Options of one kind each (keysetLimit: maps, capacity: deques) that every
// constructor keeps, as the original's do: registration (convertStates)
// refuses them on another kind, naming the field.
const SHAPE_OPTIONS = ['keysetLimit', 'capacity'];

function defineState(name, kind, payload, options, allowed) {
  if (options === undefined || options === null) options = {};
  if (typeof options !== 'object' || Array.isArray(options)) {
    throw new TypeError(`${name === undefined ? 'a state definition' : `state definition ${JSON.stringify(name)}`}: ` +
                        'options must be an object');
  }
  const def = { name, kind, payload };
  for (const field of [...allowed, ...SHAPE_OPTIONS]) {
    if (options[field] !== undefined) def[field] = options[field];
  }
  for (const field of Object.keys(options)) {
    if (!allowed.includes(field) && !SHAPE_OPTIONS.includes(field) && options[field] !== undefined) {
      throw new TypeError(`state definition ${JSON.stringify(name)}: unknown option '${field}' for a ` +
                          `${payload === 'message' ? `message ${kind}` : kind} (options: ${allowed.join(', ')})`);
    }
  }
  Object.freeze(def);
  DEFINITIONS.set(def, true);
  return def;
}

const COMMON = ['ttlSeconds', 'readUncommitted'];
const PUBLISHED = [...COMMON, 'published', 'readCache'];
const value = (name, options) => defineState(name, 'value', 'json', options, PUBLISHED);
const map = (name, options) => defineState(name, 'map', 'json', options, [...PUBLISHED, 'keysetLimit']);
const deque = (name, options) => defineState(name, 'deque', 'json', options, [...PUBLISHED, 'capacity']);
const messageValue = (name, options) => defineState(name, 'value', 'message', options, COMMON);
const messageMap = (name, options) => defineState(name, 'map', 'message', options, [...COMMON, 'keysetLimit']);
const messageDeque = (name, options) => defineState(name, 'deque', 'message', options, [...COMMON, 'capacity']);

// How a bad value is shown in an error: strings quoted, others as written.
function shown(v) {
  if (typeof v === 'string') return JSON.stringify(v);
  if (v === null || Array.isArray(v)) return v === null ? 'null' : 'an array';
  if (typeof v === 'object') return 'an object';
  if (typeof v === 'bigint') return `${v}n`;
  if (typeof v === 'symbol' || typeof v === 'function') return `a ${typeof v}`;
  return String(v);
}

// stateCollections, checked (§5.4's texts), as the addon's flat array:
// [name, kind, payload, ttlSeconds, readUncommitted, published, keysetLimit,
// capacity, ...]; and name -> {kind, payload} for context.state().
function convertStates(list) {
  const flat = [];
  const registry = new Map();
  if (list === undefined || list === null) return [flat, registry];
  if (!Array.isArray(list)) {
    throw new TypeError(`option stateCollections: expected an array of state definitions, got ${shown(list)}`);
  }
  list.forEach((c, i) => {
    const at = `stateCollections[${i}]`;
    if (c === null || typeof c !== 'object' || Array.isArray(c)) {
      throw new TypeError(`${at}: expected a state definition (value(), map(), deque(), ...), got ${shown(c)}`);
    }
    for (const field of Object.keys(c)) {
      if (!STATE_FIELDS.includes(field)) {
        throw new RangeError(`${at}: unknown field '${field}' (fields: ${STATE_FIELDS.join(', ')})`);
      }
    }
    if (typeof c.name !== 'string' || c.name === '') {
      throw new RangeError(`${at}.name: expected a non-empty string, got ${shown(c.name)}`);
    }
    if (!Object.hasOwn(STATE_KINDS, c.kind)) {
      throw new RangeError(`${at}.kind: expected "value", "map", or "deque", got ${shown(c.kind)}`);
    }
    if (!Object.hasOwn(STATE_PAYLOADS, c.payload)) {
      throw new RangeError(`${at}.payload: expected "json" or "message", got ${shown(c.payload)}`);
    }
    const whole = (field, min, max) => {
      const v = c[field];
      if (v === undefined) return undefined;
      if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
        throw new RangeError(`${at}.${field}: must be a whole number in ${min}..=${max}, got ${shown(v)}`);
      }
      return v;
    };
    const bool = (field) => {
      const v = c[field];
      if (v !== undefined && typeof v !== 'boolean') {
        throw new TypeError(`${at}.${field}: expected a boolean, got ${shown(v)}`);
      }
      return v === true;
    };
    if (c.keysetLimit !== undefined && c.kind !== 'map') {
      throw new RangeError(`${at}.keysetLimit: only valid for map collections`);
    }
    if (c.capacity !== undefined && c.kind !== 'deque') {
      throw new RangeError(`${at}.capacity: only valid for deque collections`);
    }
    const ttl = whole('ttlSeconds', 1, MAX_TTL_S);
    const keysetLimit = whole('keysetLimit', 0, 4096);
    const capacity = whole('capacity', 1, 4294967295); // the original's bound
    const readUncommitted = bool('readUncommitted');
    const published = bool('published');
    readCacheMs(c.readCache, `${at}.readCache`); // used by readers (client.state()), checked here too
    flat.push(c.name, STATE_KINDS[c.kind], STATE_PAYLOADS[c.payload], ttl || 0, readUncommitted, published,
              keysetLimit === undefined ? -1 : keysetLimit, capacity || 0);
    registry.set(c.name, { kind: c.kind, payload: c.payload });
  });
  return [flat, registry];
}

// A definition's readCache as prosody_published_open's read_cache_ms: -1
// (not given: the client's stateReadCache), 0 (false or { disabled: true }:
// read the store every time), or { ttlMs } rounded to whole milliseconds.
function readCacheMs(rc, at) {
  if (rc === undefined) return -1;
  if (rc === false) return 0;
  const { ttlMs, disabled } = readCacheFields(rc, at);
  if (ttlMs !== undefined && (typeof ttlMs !== 'number' || !Number.isFinite(ttlMs) || ttlMs < 0)) {
    throw new RangeError(`${at}.ttlMs: expected milliseconds (a number >= 0), got ${shown(ttlMs)}`);
  }
  if (disabled) return 0;
  return ttlMs === undefined ? -1 : Math.round(ttlMs);
}

// libprosody's operations (prosody_state_op_t).
const SOP = { get: 0, getMany: 1, set: 2, remove: 3, clear: 4, contains: 5, pushBack: 6, pushFront: 7,
              popBack: 8, popFront: 9, peekBack: 10, peekFront: 11, len: 12, scan: 13, commit: 14,
              rollback: 15 };
const SCAN_CHUNK = 256;

// A failure of the addon's as a state error: a permanent one (no such
// collection, a kind recorded otherwise) discards the event if rethrown;
// every other (a stale handle, the store, a refused argument) retries it.
function stateError(e) {
  if (isStateError(e)) return e;
  const message = e && typeof e.message === 'string' ? e.message : String(e);
  const err = e && e.code === 'PROSODY_ERR_PERMANENT'
    ? new PermanentStateError(message)
    : new TransientStateError(message);
  if (e && typeof e.code === 'string') err.code = e.code;
  return err;
}

// The JSON text of a value to store; a null or a value without a JSON form
// is refused (transient) before libprosody is asked.
// (`name`: the collection, which each message names.)
function encodeState(v, method, remedy, name) {
  if (v !== null && typeof v === 'object' && DELIVERED.has(v)) {
    throw new TransientStateError(`${method}: a Kafka message cannot be stored in a JSON collection ("${name}"); ` +
                                  'store its payload, or use a message collection');
  }
  if (v === null || v === undefined) {
    throw new TransientStateError(`${method}: cannot store ${v} in "${name}"; a top-level null means absence ` +
                                  `(use ${remedy})`);
  }
  if (typeof v === 'function' || typeof v === 'symbol' || typeof v === 'bigint') {
    throw new TransientStateError(`${method}: a ${typeof v} has no JSON form and cannot be stored in "${name}"`);
  }
  let text;
  try {
    text = JSON.stringify(v);
  } catch (e) {
    throw new TransientStateError(`${method}: the value for "${name}" has no JSON form: ${e && e.message}`);
  }
  if (text === undefined || text === 'null') {
    throw new TransientStateError(`${method}: the value for "${name}" has no JSON form (its toJSON gave ${text})`);
  }
  return text;
}

function mapKey(key, method, name) {
  if (typeof key !== 'string') {
    throw new TransientStateError(`${method}: a key of map "${name}" must be a string, got ${shown(key)}`);
  }
  return key;
}

function scanDirection(direction, method, name) {
  if (direction === undefined || direction === 'forward') return false;
  if (direction === 'backward') return true;
  throw new TransientStateError(`${method}: direction must be "forward" or "backward", got ${shown(direction)} ` +
                                `(scanning "${name}")`);
}

const parsed = (json) => (json === null ? null : JSON.parse(json));

// The messages this package gave a handler (onMessage's, and those read
// back from a message collection) -> [topic, partition, offset (a number)]:
// what a message collection keeps of one. Other objects cannot be stored
// there (Prosody can reload only records it was given).
const DELIVERED = new WeakMap();

// A Message as handlers receive it; `text` is the payload's JSON text.
// Under the current contract (`current`) the offset is a bigint.
function deliveredMessage(topic, partition, offset, timestamp, key, text, current) {
  let payload;
  try {
    payload = JSON.parse(text);
  } catch (e) {
    payload = null; // libprosody only delivers valid JSON
  }
  const m = { topic, partition, offset: current ? BigInt(offset) : offset, timestamp: new Date(timestamp), key,
              payload };
  DELIVERED.set(m, [topic, partition, offset]);
  return m;
}

// What a message collection's write passes: the coordinates of a
// delivered message; anything else is refused (transient).
function messageRef(v, method, name) {
  const ref = v !== null && typeof v === 'object' ? DELIVERED.get(v) : undefined;
  if (!ref) {
    throw new TransientStateError(`${method}: expected a Kafka message; a JSON value cannot be stored in a message ` +
                                  `collection ("${name}" keeps messages a handler was given; got ${shown(v)})`);
  }
  return { refTopic: ref[0], refPartition: ref[1], refOffset: ref[2] };
}

class StateHandle {
  // `message`: a message collection (its items are Messages). `event`
  // null: a published collection's read-only view for one Kafka key (see
  // PublishedState), `handle` then { reader, key }.
  constructor(client, event, handle, name, message) {
    this._client = client;
    this._event = event;
    this._handle = handle;
    this._name = name;
    this._message = message;
  }

  // What a write passes for item `v`: its JSON text, or in a message
  // collection the message's coordinates.
  _item(v, method, remedy) {
    return this._message ? messageRef(v, method, this._name) : { json: encodeState(v, method, remedy, this._name) };
  }

  // An item of a result: a JSON document's text, or a message collection's
  // record ([topic, partition, offset, timestamp, key, payload]); null
  // when absent.
  _decode(x) {
    if (x === null || !this._message) return parsed(x);
    return deliveredMessage(x[0], x[1], x[2], x[3], x[4], x[5], this._client._current);
  }

  // Runs operation `op`: a promise of [number, key, json, ...].
  _call(op, { key = null, json = null, keys = null, index = 0, after = null, limit = 0, backward = false,
              keysOnly = false, refTopic = null, refPartition = 0, refOffset = 0 } = {}) {
    if (this._event && this._event.done) {
      return Promise.reject(new TransientStateError(
        `state "${this._name}": the handle is used after its handler finished; a handle is valid only ` +
        'during the handler invocation that opened it'));
    }
    const native = this._client._native;
    try {
      return (this._event
        ? native.stateOp(this._handle, op, key, json, keys, index, after, limit, backward, keysOnly, refTopic,
                         refPartition, refOffset)
        : native.publishedOp(this._handle.reader, op, key, json, keys, index, after, limit, backward, keysOnly,
                             refTopic, refPartition, refOffset, this._handle.key))
        .catch((e) => { throw stateError(e); });
    } catch (e) {
      return Promise.reject(stateError(e));
    }
  }

  async clear() { await this._call(SOP.clear); }

  async commit() { await this._call(SOP.commit); }

  async rollback() { await this._call(SOP.rollback); }

  // A scan in chunks; `item(key, json)` makes what it yields.
  _scan(method, direction, keysOnly, item) {
    return new StateScan(this, scanDirection(direction, method, this._name), keysOnly, item);
  }

  // Why the handle can no longer be used, or null (a published view can
  // always be).
  _stale(what) {
    return this._event && this._event.done
      ? new TransientStateError(`state "${this._name}": ${what} is used after its handler finished`)
      : null;
  }
}

class ValueState extends StateHandle {
  async get() {
    const r = await this._call(SOP.get);
    return r.length > 1 ? this._decode(r[2]) : null;
  }

  async set(v) {
    await this._call(SOP.set, this._item(v, 'set', 'clear()'));
  }
}

class MapState extends StateHandle {
  async get(key) {
    const r = await this._call(SOP.get, { key: mapKey(key, 'get', this._name) });
    return r.length > 1 ? this._decode(r[2]) : null;
  }

  async getMany(keys) {
    if (!Array.isArray(keys)) {
      throw new TransientStateError(`getMany: expected an array of keys of map "${this._name}", got ${shown(keys)}`);
    }
    keys.forEach((k) => {
      mapKey(k, 'getMany', this._name);
      if (k.includes('\0')) {
        throw new TransientStateError(`getMany: a key of map "${this._name}" cannot contain a NUL character (\\0)`);
      }
    });
    if (keys.length === 0) return [];
    const r = await this._call(SOP.getMany, { keys });
    const out = [];
    for (let i = 2; i < r.length; i += 2) out.push(this._decode(r[i]));
    return out;
  }

  async has(key) {
    const r = await this._call(SOP.contains, { key: mapKey(key, 'has', this._name) });
    return r[0] === 1;
  }

  async set(key, v) {
    mapKey(key, 'set', this._name);
    await this._call(SOP.set, { key, ...this._item(v, 'set', 'delete(key)') });
  }

  async delete(key) {
    await this._call(SOP.remove, { key: mapKey(key, 'delete', this._name) });
  }

  entries(direction) { return this._scan('entries', direction, false, (k, j) => [k, this._decode(j)]); }

  keys(direction) { return this._scan('keys', direction, true, (k) => k); }

  values(direction) { return this._scan('values', direction, false, (k, j) => this._decode(j)); }

  [Symbol.asyncIterator]() { return this.entries(); }
}

class DequeState extends StateHandle {
  async push(v) {
    await this._call(SOP.pushBack, this._item(v, 'push', 'pop() or clear()'));
  }

  async unshift(v) {
    await this._call(SOP.pushFront, this._item(v, 'unshift', 'shift() or clear()'));
  }

  async pop() { return this._one(SOP.popBack); }

  async shift() { return this._one(SOP.popFront); }

  // Array.prototype.at's rules: negative counts from the back; out of range
  // is null. The two ends read their endpoint alone.
  async at(index) {
    if (typeof index !== 'number' || !Number.isSafeInteger(index)) {
      throw new TransientStateError(`at: index must be a safe integer, got ${shown(index)}`);
    }
    if (index === 0) return this._one(SOP.peekFront);
    if (index === -1) return this._one(SOP.peekBack);
    return this._one(SOP.get, { index });
  }

  async length() {
    return (await this._call(SOP.len))[0];
  }

  async isEmpty() {
    return (await this.length()) === 0;
  }

  values(direction) { return this._scan('values', direction, false, (k, j) => this._decode(j)); }

  [Symbol.asyncIterator]() { return this.values(); }

  async _one(op, args) {
    const r = await this._call(op, args);
    return r.length > 1 ? this._decode(r[2]) : null;
  }
}

// An async iterator over a collection, pulling SCAN_CHUNK items at a time
// after the last key it saw (a deque's items have their positions as keys).
// next() and return() are served in call order: concurrent next() calls
// never yield an item twice.
class StateScan {
  constructor(handle, backward, keysOnly, item) {
    this._h = handle;
    this._backward = backward;
    this._keysOnly = keysOnly;
    this._item = item;
    this._buffer = [];
    this._at = 0;
    this._after = null;
    this._end = false;
    this._closed = false;
    this._queue = Promise.resolve();
  }

  [Symbol.asyncIterator]() { return this; }

  next() { return this._serial(() => this._next()); }

  return(v) {
    return this._serial(async () => {
      this._close();
      return { value: v, done: true };
    });
  }

  _serial(fn) {
    const r = this._queue.then(fn);
    this._queue = r.then(() => {}, () => {});
    return r;
  }

  _close() {
    this._closed = true;
    this._buffer = [];
  }

  async _next() {
    if (this._closed) return { value: undefined, done: true };
    const stale = this._h._stale('a scan');
    if (stale) {
      this._close();
      throw stale;
    }
    if (this._at === this._buffer.length) {
      if (this._end) {
        this._close();
        return { value: undefined, done: true };
      }
      let r;
      try {
        r = await this._h._call(SOP.scan, { after: this._after, limit: SCAN_CHUNK, backward: this._backward,
                                           keysOnly: this._keysOnly });
      } catch (e) {
        this._close();
        throw e;
      }
      this._buffer = [];
      for (let i = 1; i < r.length; i += 2) this._buffer.push(this._item(r[i], r[i + 1]));
      this._at = 0;
      // The end, or no item to resume after (nothing was returned).
      this._end = r[0] === 1 || r.length === 1;
      if (r.length > 1) this._after = r[r.length - 2];
      if (this._buffer.length === 0) {
        this._close();
        return { value: undefined, done: true };
      }
    }
    return { value: this._buffer[this._at++], done: false };
  }
}

const STATE_CLASSES = [ValueState, MapState, DequeState];

// ---------------------------------------------------------------------------
// Published state: another service's committed collections, read by Kafka
// key outside handlers (client.state(); README "Published state"). Each
// method runs the handler-side handle's read method on a view of the key's
// collection (StateHandle with no event), so the checks, results and errors
// are the same.

class PublishedState {
  constructor(client, reader, subsystem, name) {
    this._client = client;
    this._reader = reader; // prosody_published_t, freed with the client
    this._subsystem = subsystem;
    this._name = name;
  }

  get subsystem() { return this._subsystem; }

  get name() { return this._name; }

  // The view of `key`'s collection; throws TransientStateError for a key
  // that is not a string.
  _for(key, method) {
    if (typeof key !== 'string') {
      throw new TransientStateError(`${method}: the Kafka key of published "${this._name}" must be a string, ` +
                                    `got ${shown(key)}`);
    }
    const View = STATE_CLASSES[STATE_KINDS[this.constructor.kind]];
    return new View(this._client, null, { reader: this._reader, key }, this._name, false);
  }
}

class PublishedValue extends PublishedState {
  static kind = 'value';

  async get(key) { return this._for(key, 'get').get(); }
}

class PublishedMap extends PublishedState {
  static kind = 'map';

  async get(key, mapKey) { return this._for(key, 'get').get(mapKey); }

  async getMany(key, mapKeys) { return this._for(key, 'getMany').getMany(mapKeys); }

  async has(key, mapKey) { return this._for(key, 'has').has(mapKey); }

  entries(key, direction) { return this._for(key, 'entries').entries(direction); }

  keys(key, direction) { return this._for(key, 'keys').keys(direction); }

  values(key, direction) { return this._for(key, 'values').values(direction); }
}

class PublishedDeque extends PublishedState {
  static kind = 'deque';

  async length(key) { return this._for(key, 'length').length(); }

  async isEmpty(key) { return this._for(key, 'isEmpty').isEmpty(); }

  async at(key, index) { return this._for(key, 'at').at(index); }

  values(key, direction) { return this._for(key, 'values').values(direction); }
}

const PUBLISHED_CLASSES = { value: PublishedValue, map: PublishedMap, deque: PublishedDeque };

// ---------------------------------------------------------------------------
// Context

const OP = { schedule: 0, unschedule: 1, clearAndSchedule: 2, clearScheduled: 3, scheduled: 4 };

function timeMs(date, method) {
  if (!(date instanceof Date)) {
    throw new TypeError(`${method}: expected a Date, got ${date === null ? 'null' : typeof date}`);
  }
  if (Number.isNaN(date.getTime())) throw new TypeError(`${method}: expected a valid Date, got an Invalid Date`);
  return date.getTime();
}

class Context {
  constructor(client, state) {
    this._client = client;
    this._state = state;
  }

  get shouldCancel() {
    const s = this._state;
    return s.done || s.cancelled || this._client._native.shouldCancel(s.ev);
  }

  // Resolves when the event is cancelled or its handler has finished.
  onCancel() {
    const s = this._state;
    if (!s.cancelPromise) {
      s.cancelPromise = s.done || s.cancelled
        ? Promise.resolve()
        : new Promise((resolve) => { s.resolveCancel = resolve; });
    }
    return s.cancelPromise;
  }

  // `time` is required (a Date) when `timed`; the other calls take none.
  _op(kind, timed, time, method) {
    const s = this._state;
    if (s.done) {
      return Promise.reject(new ProsodyError(
        'the context is stale: its handler has already finished', 'PROSODY_ERR_STATE'));
    }
    try {
      const ms = timed ? timeMs(time, method) : 0;
      return this._client._native.timerOp(s.ev, kind, ms).catch(rethrow);
    } catch (e) {
      return Promise.reject(classifyNative(e));
    }
  }

  schedule(time) { return this._op(OP.schedule, true, time, 'schedule'); }
  clearAndSchedule(time) { return this._op(OP.clearAndSchedule, true, time, 'clearAndSchedule'); }
  unschedule(time) { return this._op(OP.unschedule, true, time, 'unschedule'); }
  clearScheduled() { return this._op(OP.clearScheduled, false, undefined, 'clearScheduled'); }
  scheduled() {
    return this._op(OP.scheduled, false, undefined, 'scheduled').then((times) => times.map((t) => new Date(t)));
  }

  // The handle of a keyed-state collection for this event's key: one per
  // definition within the event, valid until its handler finishes.
  state(definition) {
    const s = this._state;
    if (definition === null || typeof definition !== 'object' || !DEFINITIONS.has(definition)) {
      throw new TransientStateError('state: definition must come from a Prosody state definition constructor');
    }
    if (s.done) {
      throw new TransientStateError('state: the context is stale: its handler has already finished');
    }
    if (!s.handles) s.handles = new Map();
    let h = s.handles.get(definition);
    if (h) return h;
    const { name, kind, payload } = definition;
    if (typeof name !== 'string' || name === '') {
      throw new TransientStateError(`state: a definition's name must be a non-empty string, got ${shown(name)}`);
    }
    const registered = this._client._states.get(name);
    const what = (d) => (d.payload === 'message' ? `message ${d.kind}` : d.kind);
    if (!registered) {
      throw new PermanentStateError(`state: no collection "${name}" is registered (the client's stateCollections)`);
    }
    if (registered.kind !== kind || registered.payload !== payload) {
      throw new PermanentStateError(`state: collection "${name}" is registered as a ${what(registered)}, ` +
                                    `not a ${what(definition)}`);
    }
    let opened;
    try {
      opened = this._client._native.stateOpen(s.ev, name);
    } catch (e) {
      throw stateError(e);
    }
    h = new STATE_CLASSES[opened[1]](this._client, s, opened[0], name, payload === 'message');
    s.handles.set(definition, h);
    return h;
  }
}

// ---------------------------------------------------------------------------
// ProsodyClient

class ProsodyClient {
  // The 0.1 contract (README: "Two contracts"); `await ProsodyClient.create()`
  // gives the current one.
  constructor(config) {
    this._init(config, false, 'ProsodyClient');
  }

  // The current API's construction: the client is made on libuv's pool (it
  // may wait, e.g. for the mock cluster), so the event loop goes on.
  static async create(config) {
    const client = Object.create(this.prototype);
    client._init(config, true, 'ProsodyClient.create');
    try {
      await client._native.open();
    } catch (e) {
      throw wrapConfigError(e);
    }
    return client;
  }

  _init(config, current, what) {
    const [withStates, logger] = splitLogger(config);
    let options = withStates;
    let stateList;
    if (options !== null && typeof options === 'object' && !Array.isArray(options) && 'stateCollections' in options) {
      ({ stateCollections: stateList, ...options } = options);
    }
    const opts = convertOptions(options, what);
    const [states, registry] = convertStates(stateList);
    this._states = registry; // name -> {kind, payload}, for context.state()
    try {
      this._native = new native.NativeClient(opts, logger ? logForwarder(logger) : undefined, current, states);
    } catch (e) {
      throw wrapConfigError(e);
    }
    this._current = current;
    this._shutdown = null;
    this._startError = null; // why the last subscribe() could not start
    // message_spans / timer_spans as libprosody resolved them (set, env, default).
    const [message, timer] = this._native.followsFrom();
    this._follows = { message, timer };
    this._inflight = new Map(); // event id -> state
    this._earlyCancels = new Set(); // ids cancelled before their event arrived
    this._results = []; // [ev, result, text, ...] not yet reported
    this._flush = () => {
      const r = this._results;
      this._results = [];
      this._native.completeMany(r);
    };
    this._handler = null;
    this._subscribing = null;
    this._unsubscribing = null;
    this._readers = new Map(); // client.state()'s readers: id -> promise of one
  }

  get sourceSystem() {
    return this._native.sourceSystem();
  }

  // A reader of collection `definition` as published by service
  // `subsystem`: PublishedValue, PublishedMap or PublishedDeque. Opened
  // off the event loop (outside mock mode the first one connects to
  // Cassandra); the same subsystem, name, kind and readCache give the
  // same reader, which lives as long as the client.
  async state(subsystem, definition) {
    if (definition === null || typeof definition !== 'object' || !DEFINITIONS.has(definition) ||
        definition.payload !== 'json' || !Object.hasOwn(PUBLISHED_CLASSES, definition.kind)) {
      throw new TypeError('definition must be a JSON value, map, or deque definition');
    }
    const { name, kind } = definition;
    if (typeof name !== 'string' || name === '') {
      throw new TransientStateError(`state: a definition's name must be a non-empty string, got ${shown(name)}`);
    }
    if (typeof subsystem !== 'string') {
      throw new TransientStateError(`state: the subsystem must be a string, got ${shown(subsystem)}`);
    }
    const cacheMs = readCacheMs(definition.readCache, `state: definition "${name}".readCache`);
    const id = JSON.stringify([subsystem, name, kind, cacheMs]);
    let opened = this._readers.get(id);
    if (!opened) {
      opened = (async () => {
        const reader = await this._native.publishedOpen(subsystem, name, STATE_KINDS[kind], cacheMs);
        return new PUBLISHED_CLASSES[kind](this, reader, subsystem, name);
      })().catch((e) => {
        this._readers.delete(id); // a later call tries again (this runs after the set below)
        throw stateError(e);
      });
      this._readers.set(id, opened);
    }
    return opened;
  }

  async consumerState() {
    const state = this._native.consumerState();
    if (this._current && state === ConsumerState.ConfigurationFailed) {
      throw new ProsodyError(`consumer configuration failed: ${this._startError || 'see the log'}`,
                             'PROSODY_ERR_CONFIG');
    }
    return state;
  }

  async assignedPartitionCount() {
    return this._native.assignedPartitionCount();
  }

  async isStalled() {
    return this._native.isStalled();
  }

  // The probe server's port while subscribed, or null.
  get probePort() {
    const p = this._native.probePort();
    return p < 0 ? null : p;
  }

  send(topic, key, payload, signal) {
    if (signal && signal.aborted) return Promise.reject(abortError(signal));
    let json;
    try {
      json = JSON.stringify(payload);
    } catch (e) {
      return Promise.reject(e);
    }
    if (json === undefined) {
      return Promise.reject(new TypeError('send: the payload is not JSON-serialisable'));
    }
    return this._sendRecord(topic, key, json, signal);
  }

  // An excise record: the key with no value (a Kafka tombstone), which asks
  // the consumers' onExcise to delete what they keep for the key.
  excise(topic, key, signal) {
    if (signal && signal.aborted) return Promise.reject(abortError(signal));
    return this._sendRecord(topic, key, null, signal);
  }

  // Stops consuming (when subscribed), waits for the records being sent and
  // refuses every later operation. Repeated calls share one promise.
  shutdown() {
    if (!this._shutdown) {
      this._shutdown = (async () => {
        await this.unsubscribe();
        await this._native.shutdown().catch(rethrow);
      })();
    }
    return this._shutdown;
  }

  _sendRecord(topic, key, json, signal) {
    const [tp, ts, bg] = traceHeaders();
    let sent;
    try {
      sent = this._native.send(topic, key, json, tp, ts, bg).catch(rethrow);
    } catch (e) {
      return Promise.reject(classifyNative(e));
    }
    if (!signal) return sent;
    // An abort ends the wait early; the record may still be delivered.
    return new Promise((resolve, reject) => {
      const onAbort = () => reject(abortError(signal));
      signal.addEventListener('abort', onAbort, { once: true });
      sent.then((v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      }, (e) => {
        signal.removeEventListener('abort', onAbort);
        reject(e);
      });
    });
  }

  subscribe(handler) {
    if (this._current) return this._subscribeCurrent(handler);
    // Both methods are optional (the specification's EventHandler), but a
    // handler needs one, and one that is given must be a function.
    if (handler === null || (typeof handler !== 'object' && typeof handler !== 'function')) {
      throw new TypeError('subscribe() needs a handler object with an onMessage and/or an onTimer method');
    }
    for (const name of ['onMessage', 'onTimer', 'onExcise']) {
      if (handler[name] !== undefined && handler[name] !== null && typeof handler[name] !== 'function') {
        throw new TypeError(`subscribe(): handler.${name} must be a function, got ${typeof handler[name]}`);
      }
    }
    const hasMessage = typeof handler.onMessage === 'function';
    const hasTimer = typeof handler.onTimer === 'function';
    if (!hasMessage && !hasTimer) {
      throw new TypeError('subscribe() needs a handler with an onMessage or an onTimer method');
    }
    // The handler is set once the native call accepted: it throws when
    // already subscribed, and the running subscription keeps its handler.
    // (No batch can arrive before this method returns.) Without onMessage
    // the addon completes each message as a success on the engine thread:
    // it never crosses to JavaScript, and its offset is committed.
    // An onExcise receives excise records; without one they are committed
    // past, as the 0.1 contract has it.
    return this._subscribeNative(handler, hasTimer, hasMessage, typeof handler.onExcise === 'function');
  }

  // The current API's subscribe: all three methods are required, and
  // checked before anything starts.
  async _subscribeCurrent(handler) {
    if (handler === null || (typeof handler !== 'object' && typeof handler !== 'function')) {
      throw new TypeError('subscribe() needs an EventHandler object');
    }
    for (const name of ['onMessage', 'onExcise', 'onTimer']) {
      if (typeof handler[name] !== 'function') throw new TypeError(`EventHandler.${name} must be a function`);
    }
    return this._subscribeNative(handler, true, true, true);
  }

  _subscribeNative(handler, hasTimer, hasMessage, hasExcise) {
    this._startError = null;
    this._subscribing = this._native.subscribe((batch) => this._dispatch(batch), hasTimer, hasMessage, hasExcise)
      .catch((e) => {
        this._startError = e && e.message;
        rethrow(e);
      });
    this._handler = handler;
    return this._subscribing;
  }

  unsubscribe() {
    // Concurrent calls share the one in flight: a second native unsubscribe
    // would return at once (nothing left to stop) and drop the dispatcher
    // while the first still waits for the running handlers, whose
    // cancellations would then never reach them.
    if (!this._unsubscribing) {
      this._unsubscribing = this._unsubscribe().finally(() => { this._unsubscribing = null; });
    }
    return this._unsubscribing;
  }

  async _unsubscribe() {
    if (this._subscribing) {
      // A subscribe still starting on libuv's pool goes first.
      await this._subscribing.catch(() => {});
      this._subscribing = null;
    }
    await this._native.unsubscribe().catch(rethrow);
    this._handler = null;
  }

  // One call per batch from the addon: STRIDE slots per event (see
  // src/bridge.c): [kind, id, ev, ...]; kind 0 message, 1 timer, 2 cancel.
  _dispatch(batch) {
    this._tracing = tracing();
    for (let i = 0; i < batch.length; i += STRIDE) {
      const kind = batch[i];
      if (kind === 2) {
        const s = this._inflight.get(batch[i + 1]);
        if (s) cancelState(s);
        // An event cancelled before the hand-over can see its cancellation
        // arrive in the batch before its own: applied when it starts.
        else this._earlyCancels.add(batch[i + 1]);
        continue;
      }
      this._start(batch, i, kind);
    }
  }

  _start(b, i, kind) {
    const id = b[i + 1];
    const controller = new AbortController();
    const state = { ev: b[i + 2], controller, done: false, cancelled: false, resolveCancel: null,
                    cancelPromise: null };
    this._inflight.set(id, state);
    if (this._earlyCancels.size && this._earlyCancels.delete(id)) cancelState(state);
    const context = new Context(this, state);
    const handler = this._handler;
    let event;
    let method;
    let methodName = kind === 0 ? 'onMessage' : 'onTimer';
    let rec;
    // The current API's offsets are bigint; the 0.1 contract's numbers.
    const offset = kind === 0 && this._current ? BigInt(b[i + 5]) : b[i + 5];
    if (kind === 0 && b[i + 8] === undefined) {
      // An excise record (no value): its own method and event, no payload.
      event = { topic: b[i + 3], partition: b[i + 4], offset, timestamp: new Date(b[i + 6]), key: b[i + 7] };
      method = handler && handler.onExcise;
      methodName = 'onExcise';
      if (this._tracing) {
        rec = { kind: 'message', topic: event.topic, partition: event.partition, offset: b[i + 5],
                key: event.key, traceparent: b[i + 9], tracestate: b[i + 10], baggage: b[i + 11],
                spanned: b[i + 12] === 1 };
      }
    } else if (kind === 0) {
      event = deliveredMessage(b[i + 3], b[i + 4], b[i + 5], b[i + 6], b[i + 7], b[i + 8], this._current);
      method = handler && handler.onMessage;
      if (this._tracing) {
        rec = { kind: 'message', topic: event.topic, partition: event.partition, offset: b[i + 5],
                key: event.key, traceparent: b[i + 9], tracestate: b[i + 10], baggage: b[i + 11],
                spanned: b[i + 12] === 1 };
      }
    } else {
      event = { key: b[i + 3], time: new Date(b[i + 4]) };
      method = handler && handler.onTimer;
      if (this._tracing) rec = { kind: 'timer', key: event.key, traceparent: b[i + 9], spanned: b[i + 12] === 1 };
    }
    let span = null;
    const finish = (result, text) => {
      if (state.done) return;
      state.done = true;
      this._inflight.delete(id);
      if (span) {
        if (result !== RESULT.success) span.setStatus({ code: otel.SpanStatusCode.ERROR, message: text });
        span.end();
      }
      // Results of one turn go to libprosody together (one engine wake-up).
      const pending = this._results;
      if (pending.length === 0) queueMicrotask(this._flush);
      pending.push(state.ev, result, text);
      if (state.resolveCancel) state.resolveCancel();
    };
    let returned;
    try {
      if (this._tracing) {
        // A span of libprosody's own already applied messageSpans/timerSpans.
        [returned, span] = withSpan(rec, !rec.spanned && this._follows[rec.kind],
                                    () => method.call(handler, context, event, controller.signal));
      } else {
        returned = method.call(handler, context, event, controller.signal);
      }
    } catch (e) {
      finish(...outcome(e));
      return;
    }
    this._settle(returned, handler, methodName, finish);
  }

  // Reports what a handler returned: a plain value is a success; a promise
  // (any thenable) reports how it settles; a generator (an `async *` or `*`
  // method) is a failure, for its body never ran. Nothing a handler returns
  // can make this throw: a `then` getter or method that throws fails the
  // event like a rejection would.
  _settle(returned, handler, methodName, finish) {
    const failed = (e) => finish(...outcome(e));
    let then;
    try {
      const lazy = lazyKind(returned);
      if (lazy) {
        finish(RESULT.transient, `TypeError: ${handlerMethodName(handler, methodName)} returned ${lazy}, ` +
               'not a promise or a value, so its body never ran (declared with `*`?); the event failed');
        return;
      }
      then = returned !== null && (typeof returned === 'object' || typeof returned === 'function')
        ? returned.then
        : undefined;
    } catch (e) {
      failed(e);
      return;
    }
    if (typeof then !== 'function') {
      finish(RESULT.success);
      return;
    }
    try {
      then.call(returned, () => finish(RESULT.success), failed);
    } catch (e) {
      failed(e); // ignored if the thenable had already settled
    }
  }
}

function cancelState(s) {
  if (s.cancelled) return;
  s.cancelled = true;
  if (s.controller) {
    s.controller.abort(new ProsodyError('the event was cancelled (timeout, shutdown or revoke)',
                                        'PROSODY_CANCELLED'));
  }
  if (s.resolveCancel) s.resolveCancel();
}

function abortError(signal) {
  const reason = signal.reason;
  if (reason instanceof Error) return reason;
  const e = new Error('The operation was aborted');
  e.name = 'AbortError';
  return e;
}

// ---------------------------------------------------------------------------
// AdminClient

class AdminClient {
  // new AdminClient("host:port") or new AdminClient({bootstrapServers, mock, ...})
  constructor(config) {
    const opts = convertOptions(typeof config === 'string' ? { bootstrapServers: config } : config,
                                'AdminClient');
    try {
      this._native = new native.NativeAdmin(opts);
    } catch (e) {
      throw wrapConfigError(e);
    }
  }

  // createTopic(name, partitionCount?, replicationFactor?) or
  // createTopic(name, {partitionCount, replicationFactor, cleanupPolicy, retention})
  // (retention in milliseconds).
  createTopic(name, partitionCount, replicationFactor) {
    let o = {};
    if (partitionCount !== null && typeof partitionCount === 'object') o = partitionCount;
    else o = { partitionCount, replicationFactor };
    const int = (v, what, max) => {
      if (v === undefined || v === null) return 0;
      if (!Number.isInteger(v)) throw new TypeError(`createTopic: ${what} must be an integer`);
      if (v < 1 || v > max) throw new RangeError(`createTopic: ${what} must be within 1..${max}, got ${v}`);
      return v;
    };
    try {
      if (typeof name !== 'string') throw new TypeError('createTopic: name must be a string');
      const parts = int(o.partitionCount, 'partitionCount', 1000000);
      const rf = int(o.replicationFactor, 'replicationFactor', 32767);
      if (o.cleanupPolicy !== undefined && o.cleanupPolicy !== null && typeof o.cleanupPolicy !== 'string') {
        throw new TypeError('createTopic: cleanupPolicy must be a string');
      }
      let retention = 0;
      if (o.retention !== undefined && o.retention !== null) {
        if (typeof o.retention !== 'number' || !(o.retention >= 1)) {
          throw new RangeError('createTopic: retention must be a number of milliseconds >= 1');
        }
        retention = Math.round(o.retention);
      }
      return this._native.createTopic(name, parts, rf, o.cleanupPolicy ?? null, retention).catch(rethrow);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  deleteTopic(name) {
    try {
      return this._native.deleteTopic(name).catch(rethrow);
    } catch (e) {
      return Promise.reject(classifyNative(e));
    }
  }
}

bindings.ProsodyClient = ProsodyClient;
bindings.AdminClient = AdminClient;

module.exports = {
  ProsodyClient,
  AdminClient,
  Context,
  Mode,
  ConsumerState,
  EventHandlerError,
  TransientError,
  PermanentError,
  ProsodyError,
  ProsodyTransientError,
  ProsodyPermanentError,
  permanent,
  transient,
  TransientStateError,
  PermanentStateError,
  isStateError,
  value,
  map,
  deque,
  messageValue,
  messageMap,
  messageDeque,
  ValueState,
  MapState,
  DequeState,
  PublishedValue,
  PublishedMap,
  PublishedDeque,
  flushTelemetry: native.flushTelemetry,
  shutdownTelemetry: native.shutdownTelemetry,
  libraryVersion: native.libraryVersion,
};
