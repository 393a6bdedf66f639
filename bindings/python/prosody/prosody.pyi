"""Type stubs for the native module prosody.prosody."""

from datetime import datetime, timedelta
from typing import Any, Awaitable, Dict, Generator, List, Literal, Optional, Sequence, Union, overload, TypeVar

from typing_extensions import TypedDict, Unpack

from prosody.handler import EventHandler
from prosody.message import JSONValue, Message
from prosody.request import Outcome
from prosody.state import (
    DequeDefinition,
    DequeState,
    MapDefinition,
    MapState,
    MessageDequeDefinition,
    MessageMapDefinition,
    MessageValueDefinition,
    PublishedDeque,
    PublishedMap,
    PublishedValue,
    ValueDefinition,
    ValueState,
    _Definition,
)

Duration = Union[float, int, timedelta, str]
T = TypeVar("T")
V = TypeVar("V")
P = TypeVar("P")
StrList = Union[str, Sequence[str]]
Size = Union[int, str]

class ConsumerState(str):
    def __await__(self) -> Generator[Any, None, str]: ...

class Context:
    async def schedule(self, time: datetime) -> None: ...
    async def clear_and_schedule(self, time: datetime) -> None: ...
    async def unschedule(self, time: datetime) -> None: ...
    async def clear_scheduled(self) -> None: ...
    async def scheduled(self) -> List[datetime]: ...
    def should_cancel(self) -> bool: ...
    async def on_cancel(self) -> None: ...
    # Keyed state: the collection for this event's key, valid until the
    # handler returns. A message collection's items are Messages (a handler's
    # own, or ones read back from a message collection).
    @overload
    def state(self, definition: MessageValueDefinition[P]) -> ValueState[Message[P]]: ...
    @overload
    def state(self, definition: MessageMapDefinition[P]) -> MapState[Message[P]]: ...
    @overload
    def state(self, definition: MessageDequeDefinition[P]) -> DequeState[Message[P]]: ...
    @overload
    def state(self, definition: ValueDefinition[T]) -> ValueState[T]: ...
    @overload
    def state(self, definition: MapDefinition[V]) -> MapState[V]: ...
    @overload
    def state(self, definition: DequeDefinition[T]) -> DequeState[T]: ...

class _Options(TypedDict, total=False):
    """The options of docs/CONFIGURATION.md, as keywords (None: unset)."""
    bootstrap_servers: Optional[StrList]
    group_id: Optional[str]
    subscribed_topics: Optional[StrList]
    allowed_events: Optional[StrList]
    source_system: Optional[str]
    mock: Optional[bool]
    mode: Optional[str]
    max_concurrency: Optional[int]
    max_uncommitted: Optional[int]
    timeout: Optional[Duration]
    commit_interval: Optional[Duration]
    poll_interval: Optional[Duration]
    shutdown_timeout: Optional[Duration]
    stall_threshold: Optional[Duration]
    probe_port: Optional[int]
    failure_topic: Optional[str]
    partition_assignment_strategy: Optional[str]
    group_protocol: Optional[str]
    kafka_security_protocol: Optional[str]
    kafka_sasl_mechanism: Optional[str]
    kafka_sasl_username: Optional[str]
    kafka_sasl_password: Optional[str]
    kafka_sasl_oauthbearer_token_endpoint_url: Optional[str]
    kafka_sasl_oauthbearer_client_id: Optional[str]
    kafka_sasl_oauthbearer_client_secret: Optional[str]
    kafka_sasl_oauthbearer_scope: Optional[str]
    kafka_ssl_ca_location: Optional[str]
    kafka_ssl_certificate_location: Optional[str]
    kafka_ssl_key_location: Optional[str]
    kafka_ssl_key_password: Optional[str]
    kafka_ssl_endpoint_identification: Optional[bool]
    kafka_properties: Optional[StrList]
    idempotence_cache_size: Optional[int]
    idempotence_version: Optional[str]
    idempotence_ttl: Optional[Duration]
    slab_size: Optional[Duration]
    message_spans: Optional[str]
    timer_spans: Optional[str]
    send_timeout: Optional[Duration]
    max_retries: Optional[int]
    retry_base: Optional[Duration]
    max_retry_delay: Optional[Duration]
    defer_enabled: Optional[bool]
    defer_base: Optional[Duration]
    defer_max_delay: Optional[Duration]
    defer_failure_threshold: Optional[float]
    defer_failure_window: Optional[Duration]
    loader_cache_size: Optional[int]
    defer_cache_size: Optional[int]
    defer_store_cache_size: Optional[int]
    loader_seek_timeout: Optional[Duration]
    defer_seek_timeout: Optional[Duration]
    loader_discard_threshold: Optional[int]
    defer_discard_threshold: Optional[int]
    monopolization_enabled: Optional[bool]
    monopolization_threshold: Optional[float]
    monopolization_window: Optional[Duration]
    monopolization_cache_size: Optional[int]
    scheduler_failure_weight: Optional[float]
    scheduler_max_wait: Optional[Duration]
    scheduler_wait_weight: Optional[float]
    scheduler_cache_size: Optional[int]
    telemetry_topic: Optional[str]
    telemetry_enabled: Optional[bool]
    cassandra_nodes: Optional[StrList]
    cassandra_keyspace: Optional[str]
    cassandra_user: Optional[str]
    cassandra_password: Optional[str]
    cassandra_ssl: Optional[bool]
    cassandra_ssl_ca_location: Optional[str]
    cassandra_ssl_certificate_location: Optional[str]
    cassandra_ssl_key_location: Optional[str]
    cassandra_ssl_key_password: Optional[str]
    cassandra_datacenter: Optional[str]
    cassandra_rack: Optional[str]
    cassandra_retention: Optional[Duration]
    topic_partitions: Optional[int]
    topic_replication_factor: Optional[int]
    topic_cleanup_policy: Optional[str]
    topic_retention: Optional[Duration]
    log: Optional[str]
    state_collections: Optional[Sequence[_Definition]]
    subsystem: Optional[str]
    state_read_cache: Optional[Union[float, int, timedelta, str, Literal[False]]]
    peer_bind_address: Optional[str]
    probe_host: Optional[str]
    state_cache_dir: Optional[str]
    state_owned_cache_size: Optional[Size]
    state_read_cache_size: Optional[Size]
    state_recovery_delay: Optional[Duration]
    otel_exporter_otlp_endpoint: Optional[str]
    otel_exporter_otlp_protocol: Optional[str]
    otel_service_name: Optional[str]
    otel_resource_attributes: Optional[str]

class ProsodyClient:
    def __init__(self, **options: Unpack[_Options]) -> None: ...
    @classmethod
    def create(cls, **options: Unpack[_Options]) -> Awaitable["ProsodyClient"]:
        """The current API's construction: the keywords of ``__init__``."""
        ...
    async def send(self, topic: str, key: str, payload: JSONValue) -> None: ...
    async def excise(self, topic: str, key: str) -> None: ...
    # The original's subsystem requests. Not implemented in Prosody-C yet:
    # both raise NotImplementedError (a RuntimeError) and send nothing.
    async def request(
        self,
        topic: str,
        key: str,
        payload: JSONValue,
        *,
        subsystems: Sequence[str],
        timeout: timedelta,
    ) -> Dict[str, Outcome[JSONValue]]: ...
    async def request_excise(
        self, topic: str, key: str, *, subsystems: Sequence[str], timeout: timedelta
    ) -> Dict[str, Outcome[JSONValue]]: ...
    def subscribe(self, handler: EventHandler[Any, Any]) -> Awaitable[None]: ...
    async def unsubscribe(self) -> None: ...
    async def shutdown(self) -> None: ...
    def consumer_state(self) -> ConsumerState: ...
    async def assigned_partition_count(self) -> int: ...
    async def is_stalled(self) -> bool: ...
    # Published state: a reader of `definition`'s collection as published by
    # `subsystem` (any client; no subscription needed).
    @overload
    async def state(self, subsystem: str, definition: ValueDefinition[T]) -> PublishedValue[T]: ...
    @overload
    async def state(self, subsystem: str, definition: MapDefinition[V]) -> PublishedMap[V]: ...
    @overload
    async def state(self, subsystem: str, definition: DequeDefinition[T]) -> PublishedDeque[T]: ...
    @property
    def source_system(self) -> str: ...
    @property
    def probe_port(self) -> Optional[int]: ...

class AdminClient:
    def __init__(
        self,
        *,
        bootstrap_servers: Optional[StrList] = ...,
        mock: Optional[bool] = ...,
        **options: Any,
    ) -> None: ...
    async def create_topic(
        self,
        name: str,
        partition_count: Optional[int] = ...,
        replication_factor: Optional[int] = ...,
        cleanup_policy: Optional[str] = ...,
        retention: Optional[Union[timedelta, float]] = ...,
    ) -> None: ...
    async def delete_topic(self, name: str) -> None: ...

def flush_telemetry() -> None: ...
def shutdown_telemetry() -> None: ...
def library_version() -> str: ...
def mock_bootstrap_servers() -> str: ...
def mock_set_group_initial_rebalance_delay(seconds: float) -> float: ...
def options() -> Dict[str, str]: ...
