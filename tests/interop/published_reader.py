#!/usr/bin/env python3
"""A reader of published keyed state, run as a subprocess by
published_state.py with the venv of the implementation under test (ours or
the ORIGINAL package: both import as `prosody`). Its client subscribes to
nothing; it reads what member.py --publish SUBSYSTEM publishes (a value
"count", a map "seqs", a deque "log") through `await client.state(subsystem,
definition)`, with no read cache (every read goes to the store).

It answers one JSON command per line of standard input with one JSON line on
standard output (after {"event": "ready"} once the client is made):

  {"op": "read", "key": K, "map_keys": [...]}          (optional "subsystem")
      -> {"ok": true, "count", "seqs": [[k, v], ...] forward,
          "seqs_back": map keys backward, "get_many": get_many(map_keys),
          "contains": [contains(k) for map_keys], "log": deque front to back,
          "log_back": back to front, "size", "empty", "first": get(0),
          "last": get(-1), "peek", "peekleft"}
  {"op": "as", "key": K, "name": N, "kind": "value"|"map"|"deque"}
      -> the collection N read as that kind (one get, size or scan)
  any read that raises -> {"ok": false, "error": its class name, "message": str}

It exits 0 at the end of its input. Its logs go to standard error.
"""

import argparse
import asyncio
import faulthandler
import json
import logging
import sys
from typing import Any, Dict, Tuple

from original_compat import make_client, run_then_exit
from prosody import Direction, deque, map, value

KINDS = {"value": value, "map": map, "deque": deque}


class Reader:
    def __init__(self, client: Any, subsystem: str) -> None:
        self.client, self.subsystem = client, subsystem
        self.opened: Dict[Tuple[str, str, str], Any] = {}

    async def open(self, subsystem: str, name: str, kind: str) -> Any:
        """The reader of (subsystem, name) as `kind`, opened once."""
        k = (subsystem, name, kind)
        if k not in self.opened:
            self.opened[k] = await self.client.state(subsystem,
                                                     KINDS[kind](name, read_cache=False))
        return self.opened[k]

    async def read(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        sub, key, mks = cmd.get("subsystem", self.subsystem), cmd["key"], cmd["map_keys"]
        count = await self.open(sub, "count", "value")
        seqs = await self.open(sub, "seqs", "map")
        log = await self.open(sub, "log", "deque")
        return {
            "ok": True,
            "count": await count.get(key),
            "seqs": [[k, v] async for k, v in seqs.items(key)],
            "seqs_back": [k async for k in seqs.keys(key, Direction.BACKWARD)],
            "get_many": await seqs.get_many(key, mks),
            "contains": [await seqs.contains(key, mk) for mk in mks],
            "log": [v async for v in log.values(key)],
            "log_back": [v async for v in log.values(key, Direction.BACKWARD)],
            "size": await log.size(key),
            "empty": await log.is_empty(key),
            "first": await log.get(key, 0),
            "last": await log.get(key, -1),
            "peek": await log.peek(key),
            "peekleft": await log.peekleft(key),
        }

    async def read_as(self, cmd: Dict[str, Any]) -> Dict[str, Any]:
        r = await self.open(self.subsystem, cmd["name"], cmd["kind"])
        if cmd["kind"] == "value":
            got = await r.get(cmd["key"])
        elif cmd["kind"] == "map":
            got = [[k, v] async for k, v in r.items(cmd["key"])]
        else:
            got = await r.size(cmd["key"])
        return {"ok": True, "got": got}


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--cassandra", required=True)
    ap.add_argument("--keyspace", required=True)
    ap.add_argument("--subsystem", required=True)
    ap.add_argument("--group", required=True,
                    help="a group id of its own: the original's client.state() needs one "
                         "(without: RuntimeError \"unconfigured consumer\"); it joins nothing")
    args = ap.parse_args()
    faulthandler.enable()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    client = await make_client(bootstrap_servers=args.bootstrap, cassandra_nodes=args.cassandra,
                               cassandra_keyspace=args.keyspace, group_id=args.group,
                               source_system="interop-pub-reader", probe_port=None,
                               telemetry_enabled=False)
    reader = Reader(client, args.subsystem)
    print(json.dumps({"event": "ready"}), flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        cmd = json.loads(line)
        try:
            answer = await (reader.read(cmd) if cmd["op"] == "read" else reader.read_as(cmd))
        except Exception as e:  # noqa: BLE001 - the answer carries it
            answer = {"ok": False, "error": type(e).__name__, "message": str(e)}
        print(json.dumps(answer), flush=True)
    shutdown = getattr(client, "shutdown", None)
    if shutdown is not None:
        await shutdown()
    return 0


if __name__ == "__main__":
    run_then_exit(main)  # no interpreter finalization (0.6.1 may abort there)
