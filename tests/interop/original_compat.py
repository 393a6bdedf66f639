"""Both APIs of the ORIGINAL Prosody package for the interop programs that
run it (member.py, original_producer.py): prosody-events 0.2.0
(the seed API: `ProsodyClient(...)`, `subscribe` returns None, no
`shutdown`) and 0.6.1 (the current API: `await ProsodyClient.create(...)`,
coroutines, `shutdown`).

Its peer listener (requests between instances, 0.6 and later) binds port
9099 by default, which our secured Kafka test listener holds; its variable
moves it to a free loopback port (0.2.0 ignores it).
"""

import inspect
import os
from typing import Any

from prosody import ProsodyClient

os.environ.setdefault("PROSODY_PEER_BIND_ADDRESS", "127.0.0.1:0")


async def make_client(**options: Any) -> Any:
    if hasattr(ProsodyClient, "create"):
        return await ProsodyClient.create(**options)
    return ProsodyClient(**options)


async def call(client: Any, name: str, *args: Any) -> Any:
    """client.name(*args), awaited if it returns an awaitable; None when
    this version has no such method."""
    fn = getattr(client, name, None)
    if fn is None:
        return None
    result = fn(*args)
    if inspect.isawaitable(result):
        return await result
    return result
