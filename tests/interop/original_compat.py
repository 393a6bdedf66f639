"""Both APIs of the ORIGINAL Prosody package for the interop programs that
run it (member.py, original_producer.py): prosody-events 0.2.0
(the seed API: `ProsodyClient(...)`, `subscribe` returns None, no
`shutdown`) and 0.6.1 (the current API: `await ProsodyClient.create(...)`,
coroutines, `shutdown`).

Its peer listener (requests between instances, 0.6 and later) binds port
9099 by default, which our secured Kafka test listener holds; its variable
moves it to a free loopback port (0.2.0 ignores it).
"""

import asyncio
import inspect
import os
import sys
import traceback
from typing import Any, Awaitable, Callable

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


def run_then_exit(main: Callable[[], Awaitable[int]]) -> None:
    """Runs main() and exits with its code (1 if it raised, the traceback
    on standard error) without the interpreter's finalization, whatever
    happened: in about one exit of three, 0.6.1 aborts there (SIGABRT, also
    in a script that only subscribes, unsubscribes and shuts down, with no
    test around it): a tokio thread of its extension completes an asyncio
    future while Python finalizes, Python's take_gil ends that thread with
    pthread_exit, and the forced unwind through Rust frames aborts. The
    programs report what they did (and that they stopped) before main()
    returns, so the test's subject is done by then."""
    try:
        rc = asyncio.run(main())
    except BaseException:  # noqa: BLE001 - reported, then the same exit as below
        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
