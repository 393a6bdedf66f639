"""Shared fixtures. The suite runs in two tiers, like the C suite:

- ``PROSODY_TEST_TIER=mock`` (default): the embedded mock Kafka cluster and
  the in-memory timer store (``mock=True``);
- ``PROSODY_TEST_TIER=real``: Apache Kafka on ``PROSODY_TEST_BOOTSTRAP``
  (127.0.0.1:9094) and Apache Cassandra on ``PROSODY_TEST_CASSANDRA_NODES``
  (127.0.0.1:9042), started by scripts/run-tests.sh.
"""

import asyncio
import os
import time
import uuid
from typing import Any, Callable, Dict, List

import pytest

from prosody import AdminClient, ProsodyClient
from prosody import prosody as native

TIER = os.environ.get("PROSODY_TEST_TIER", "mock")
REAL = TIER == "real"
BOOTSTRAP = os.environ.get("PROSODY_TEST_BOOTSTRAP", "127.0.0.1:9094")
CASSANDRA = os.environ.get("PROSODY_TEST_CASSANDRA_NODES", "127.0.0.1:9042")
# Generous: a real broker's first group join takes several seconds.
WAIT = float(os.environ.get("PROSODY_TEST_WAIT", "60"))


def base_options() -> Dict[str, Any]:
    """Connection options of the tier, with quick commits and no probe."""
    opts: Dict[str, Any] = {"probe_port": None, "commit_interval": 0.1,
                            "poll_interval": 0.02, "shutdown_timeout": 10}
    if REAL:
        # send_timeout: the first record to a topic created a moment ago can
        # wait over the 1 s default for its metadata on a loaded 2-core CI
        # machine (seen once in CI with librdkafka 2.14.2); these tests are
        # about what arrives, not about send latency.
        opts.update(bootstrap_servers=BOOTSTRAP, cassandra_nodes=CASSANDRA,
                    cassandra_keyspace="prosody_pytest", send_timeout=10)
    else:
        opts.update(mock=True)
    return opts


def admin_options() -> Dict[str, Any]:
    return {"bootstrap_servers": BOOTSTRAP} if REAL else {"mock": True}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


class Recorder:
    """Collects what handlers saw; tests await conditions on it."""

    def __init__(self) -> None:
        self.events: List[Any] = []
        self._cond = asyncio.Condition()

    async def add(self, item: Any) -> None:
        async with self._cond:
            self.events.append(item)
            self._cond.notify_all()

    async def wait_for(self, pred: Callable[[List[Any]], bool], timeout: float = WAIT,
                       what: str = "condition") -> None:
        async with self._cond:
            try:
                await asyncio.wait_for(self._cond.wait_for(lambda: pred(self.events)), timeout)
            except asyncio.TimeoutError:
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what}; "
                    f"saw {len(self.events)} events: {self.events[-5:]!r}") from None

    async def wait_count(self, n: int, timeout: float = WAIT) -> None:
        await self.wait_for(lambda ev: len(ev) >= n, timeout, f"{n} events")


@pytest.fixture(scope="session", autouse=True)
def _prompt_group_join() -> Any:
    """No group in this suite has two members at once: in mock mode the
    cluster assigns a new group at once instead of waiting 3 s for more
    members (the real tier's broker has group.initial.rebalance.delay.ms=0
    too). Process-wide, like the cluster; restored at the end of the session.
    A test that starts members together must set the mock's 3 s back, or
    each later member waits for a rebalance."""
    if REAL:
        yield
        return
    previous = native.mock_set_group_initial_rebalance_delay(0)
    yield
    native.mock_set_group_initial_rebalance_delay(previous)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def _topics() -> Any:
    """The test's topics, deleted at its very end: `clients` depends on this
    fixture, so its consumers have left before their topic goes (a consumer
    whose topic was deleted under it can take librdkafka 30 s to close)."""
    names: List[str] = []
    yield names
    admin = AdminClient(**admin_options())
    for name in names:
        try:
            await admin.delete_topic(name)
        except Exception:  # noqa: BLE001 - best effort cleanup
            pass


@pytest.fixture
async def topic(_topics: List[str]) -> Any:
    """A fresh 4-partition topic, deleted after the test's clients left."""
    name = unique("py-topic")
    admin = AdminClient(**admin_options())
    await admin.create_topic(name, partition_count=4, replication_factor=1)
    _topics.append(name)
    return name


@pytest.fixture
async def clients(_topics: List[str]) -> Any:
    """Makes clients for a test and unsubscribes them all at the end."""
    made: List[ProsodyClient] = []

    def make(**over: Any) -> ProsodyClient:
        opts = base_options()
        # Records a consumer's own source system wrote are skipped (the
        # loop guard): tests send with a name no group uses.
        opts["source_system"] = "python-tests"
        opts.update(over)
        c = ProsodyClient(**opts)
        made.append(c)
        return c

    yield make
    for c in made:
        await c.unsubscribe()


async def wait_assigned(client: ProsodyClient, timeout: float = WAIT) -> None:
    """Waits until the client owns partitions (the group join is async)."""
    deadline = time.monotonic() + timeout
    while await client.assigned_partition_count() == 0:
        if time.monotonic() > deadline:
            raise AssertionError("no partition assigned in time")
        await asyncio.sleep(0.05)
