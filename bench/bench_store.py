#!/usr/bin/env python3
"""The Python cassandra-driver running bench_store.c's statements at the
same concurrency against the same node: the baseline of the store benchmark.

    bench_store.py HOST PORT KEYSPACE OPS CONCURRENCY
Prints "insert_ops_s N" and "select_ops_s N".
"""
import sys
import time

from cassandra.cluster import Cluster
from cassandra.concurrent import execute_concurrent_with_args


def measure(session, stmt, params, conc):
    t0 = time.monotonic()
    results = execute_concurrent_with_args(session, stmt, params,
                                           concurrency=conc,
                                           raise_on_first_error=True)
    elapsed = time.monotonic() - t0
    assert all(ok for ok, _ in results)
    return len(params) / elapsed


def main():
    host, port, ks = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    ops, conc = int(sys.argv[4]), int(sys.argv[5])
    cluster = Cluster([host], port=port, protocol_version=4)
    session = cluster.connect()
    ins = session.prepare("INSERT INTO %s.kv (k, v) VALUES (?, ?)" % ks)
    sel = session.prepare("SELECT v FROM %s.kv WHERE k = ?" % ks)
    params = [("key-%d" % (i % 10000), i) for i in range(ops)]
    keys = [(k,) for k, _ in params]
    measure(session, ins, params[: ops // 10 + 1], conc)  # warm-up
    print("insert_ops_s %.0f" % measure(session, ins, params, conc))
    measure(session, sel, keys[: ops // 10 + 1], conc)
    print("select_ops_s %.0f" % measure(session, sel, keys, conc))
    cluster.shutdown()


if __name__ == "__main__":
    main()
