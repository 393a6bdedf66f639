#!/usr/bin/env python3
"""Records CQL v4 response frames from a running Cassandra for the protocol
unit tests (tests/unit/test_cql_wire.c). Each file holds one whole frame
(header + body) as hex. Re-record with:

    python3 tests/data/cql/record.py [host] [port]

Uses only the standard library; writes into this script's directory.
"""
import os
import socket
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KS = "prosody_wire_rec"


def frame(stream, opcode, body):
    return struct.pack(">BBhBI", 4, 0, stream, opcode, len(body)) + body


def string(s):
    b = s.encode()
    return struct.pack(">H", len(b)) + b


def long_string(s):
    b = s.encode()
    return struct.pack(">I", len(b)) + b


def params(consistency=1, values=None, page_size=None, paging=None):
    flags = 0
    tail = b""
    if values:
        flags |= 0x01
        tail += struct.pack(">H", len(values))
        for v in values:
            tail += struct.pack(">i", len(v)) + v
    if page_size:
        flags |= 0x04
        tail += struct.pack(">i", page_size)
    if paging:
        flags |= 0x08
        tail += struct.pack(">i", len(paging)) + paging
    return struct.pack(">HB", consistency, flags) + tail


class Conn:
    def __init__(self, host, port):
        self.s = socket.create_connection((host, port), timeout=10)
        self.stream = 0

    def recv_exact(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.s.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed")
            buf += chunk
        return buf

    def request(self, opcode, body):
        self.stream += 1
        self.s.sendall(frame(self.stream, opcode, body))
        head = self.recv_exact(9)
        length = struct.unpack(">I", head[5:9])[0]
        return head + self.recv_exact(length)


def save(name, data):
    with open(os.path.join(HERE, name + ".hex"), "w") as f:
        f.write(data.hex() + "\n")
    print("recorded", name, len(data), "bytes")


def main():
    host = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1"
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 9042
    c = Conn(host, port)
    save("ready", c.request(0x01, struct.pack(">H", 1) + string("CQL_VERSION")
                            + string("3.0.0")))
    q = lambda text, **kw: c.request(0x07, long_string(text) + params(**kw))
    q("CREATE KEYSPACE IF NOT EXISTS %s WITH replication = {'class': "
      "'SimpleStrategy', 'replication_factor': 1}" % KS)
    q("CREATE TYPE IF NOT EXISTS %s.point (x int, label text)" % KS)
    save("schema_change", q("CREATE TABLE IF NOT EXISTS %s.wire_types (id int "
                            "PRIMARY KEY, big bigint, tiny tinyint, flag boolean, "
                            "u uuid, ts timestamp, data blob, m map<text, int>, "
                            "l list<int>, s set<text>, p frozen<point>, t text)" % KS))
    save("void", q("INSERT INTO %s.wire_types (id, big, tiny, flag, u, ts, data, "
                   "m, l, s, p, t) VALUES (1, -9000000000, -7, true, "
                   "123e4567-e89b-12d3-a456-426614174000, 1700000000123, "
                   "0xcafe, {'a': 1, 'b': 2}, [3, 1, 2], {'x', 'y'}, "
                   "{x: 5, label: 'five'}, 'héllo')" % KS))
    q("INSERT INTO %s.wire_types (id) VALUES (2)" % KS)
    save("rows_types", q("SELECT id, big, tiny, flag, u, ts, data, m, l, s, p, t "
                         "FROM %s.wire_types WHERE id = 1" % KS))
    save("rows_nulls", q("SELECT id, big, t FROM %s.wire_types WHERE id = 2" % KS))
    save("rows_paged", q("SELECT id FROM %s.wire_types" % KS, page_size=1))
    save("prepared", c.request(0x09, long_string(
        "SELECT id, t FROM %s.wire_types WHERE id = ?" % KS)))
    save("error_syntax", q("SELEC nonsense"))
    save("error_unprepared", c.request(0x0A, struct.pack(">H", 4) + b"\x01\x02\x03\x04"
                                       + params()))
    save("error_invalid", q("SELECT * FROM %s.no_such_table" % KS))


if __name__ == "__main__":
    main()
