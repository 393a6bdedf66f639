// ESM entry: the same objects as the CommonJS one.
import prosody from './index.js';

export const {
  ProsodyClient, AdminClient, Context, Mode, ConsumerState, EventHandlerError, TransientError,
  PermanentError, ProsodyError, ProsodyTransientError, ProsodyPermanentError, permanent, transient,
  TransientStateError, PermanentStateError, isStateError, value, map, deque, messageValue, messageMap,
  messageDeque, ValueState, MapState, DequeState, PublishedValue, PublishedMap, PublishedDeque, flushTelemetry,
  shutdownTelemetry, libraryVersion,
} = prosody;
export default prosody;
