"""Cleanup shared by the interop programs."""
import sys
from typing import Any

#: A schema change on a busy node can take longer than the driver's default
#: request timeout (10 s).
DROP_TIMEOUT_S = 120.0


def drop_keyspace(session: Any, keyspace: str) -> None:
    """Drops a test keyspace. A drop that still fails is reported, not
    raised: it is cleanup, and raising it from a `finally` would hide the
    test's own outcome."""
    try:
        session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=DROP_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - best effort cleanup
        print(f"interop: could not drop keyspace {keyspace}: {e}", file=sys.stderr)
