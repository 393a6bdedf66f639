#!/usr/bin/env python3
"""Sends records with the ORIGINAL Rust-based Prosody package (PyPI
prosody-events, pinned by scripts/interop-tests.sh), run as a subprocess by
the interop scenarios with the original's own venv.

It sends --rounds rounds of one record per key (--keys keys named k000...),
each round's sends awaited before the next, so that each key's records land
in order; a record's payload is {"key": K, "seq": S, "batch": B}, S counting
from --first-seq. It prints {"event": "sent", "count": N} once all are
acknowledged and exits 0; any failure is printed to standard error, exit 1.
"""

import argparse
import asyncio
import json
import sys

from original_compat import call, make_client, run_then_exit


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--keys", type=int, required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--first-seq", type=int, default=0)
    ap.add_argument("--batch", default="original")
    # The original opens its Cassandra stores even to send: a keyspace it
    # migrates.
    ap.add_argument("--cassandra", required=True)
    ap.add_argument("--keyspace", required=True)
    args = ap.parse_args()
    client = await make_client(bootstrap_servers=args.bootstrap,
                               source_system="interop-original-producer",
                               cassandra_nodes=args.cassandra,
                               cassandra_keyspace=args.keyspace,
                               probe_port=None, telemetry_enabled=False)
    count = 0
    for r in range(args.rounds):
        seq = args.first_seq + r
        sends = []
        for k in range(args.keys):
            key = f"k{k:03d}"
            sends.append(client.send(args.topic, key, {"key": key, "seq": seq,
                                                       "batch": args.batch}))
        await asyncio.gather(*sends)
        count += len(sends)
    await call(client, "shutdown")
    sys.stdout.write(json.dumps({"event": "sent", "count": count}) + "\n")
    return 0


if __name__ == "__main__":
    run_then_exit(main)  # no interpreter finalization (0.6.1 may abort there)
