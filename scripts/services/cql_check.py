#!/usr/bin/env python3
"""Readiness probe for Cassandra, standard library only.

Speaks the CQL native protocol v4 over a raw TCP socket: STARTUP (answering an
AUTHENTICATE challenge with PLAIN credentials when --user is given), then the
QUERY `SELECT release_version FROM system.local`, and prints the version.

Usage: cql_check.py [--host 127.0.0.1] [--port 9042] [--user U --password P] [--timeout 5] [-v]
Exit status: 0 when the query returns a release_version row, 1 otherwise.
"""
import argparse
import socket
import struct
import sys

VERSION = 0x04
OP_ERROR, OP_STARTUP, OP_READY, OP_AUTHENTICATE = 0x00, 0x01, 0x02, 0x03
OP_QUERY, OP_RESULT, OP_AUTH_RESPONSE, OP_AUTH_SUCCESS = 0x07, 0x08, 0x0F, 0x10
CONSISTENCY_ONE = 0x0001
RESULT_ROWS = 0x0002
FLAG_GLOBAL_TABLES_SPEC, FLAG_HAS_MORE_PAGES, FLAG_NO_METADATA = 0x1, 0x2, 0x4


class CqlError(Exception):
    pass


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by server")
        buf.extend(chunk)
    return bytes(buf)


def cql_string(s):
    b = s.encode("utf-8")
    return struct.pack(">H", len(b)) + b


def cql_long_string(s):
    b = s.encode("utf-8")
    return struct.pack(">i", len(b)) + b


class Reader:
    def __init__(self, data):
        self.data = data
        self.pos = 0

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise CqlError("truncated frame body")
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def raw(self, n):
        if self.pos + n > len(self.data):
            raise CqlError("truncated frame body")
        value = self.data[self.pos:self.pos + n]
        self.pos += n
        return value

    def string(self):
        return self.raw(self.take(">H")).decode("utf-8", "replace")

    def bytes_(self):
        n = self.take(">i")
        return None if n < 0 else self.raw(n)

    def type_option(self):
        kind = self.take(">H")
        if kind == 0x0000:            # custom
            self.string()
        elif kind in (0x0020, 0x0022):  # list, set
            self.type_option()
        elif kind == 0x0021:          # map
            self.type_option()
            self.type_option()
        elif kind == 0x0030:          # UDT
            self.string()
            self.string()
            for _ in range(self.take(">H")):
                self.string()
                self.type_option()
        elif kind == 0x0031:          # tuple
            for _ in range(self.take(">H")):
                self.type_option()
        return kind


class Connection:
    def __init__(self, host, port, timeout):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.stream = 0

    def close(self):
        self.sock.close()

    def request(self, opcode, body):
        self.stream += 1
        self.sock.sendall(struct.pack(">BBhBi", VERSION, 0, self.stream, opcode, len(body)) + body)
        header = recv_exact(self.sock, 9)
        version, _flags, stream, op, length = struct.unpack(">BBhBi", header)
        if version & 0x7F != VERSION:
            raise CqlError("unexpected protocol version 0x%02x" % version)
        if length < 0 or length > 256 * 1024 * 1024:
            raise CqlError("implausible frame length %d" % length)
        body = recv_exact(self.sock, length)
        if stream != self.stream:
            raise CqlError("stream id mismatch")
        if op == OP_ERROR:
            r = Reader(body)
            code = r.take(">i")
            raise CqlError("server error 0x%04x: %s" % (code, r.string()))
        return op, Reader(body)


def release_version(host, port, timeout, user=None, password=None):
    conn = Connection(host, port, timeout)
    try:
        startup = struct.pack(">H", 1) + cql_string("CQL_VERSION") + cql_string("3.0.0")
        op, r = conn.request(OP_STARTUP, startup)
        if op == OP_AUTHENTICATE:
            if user is None:
                raise CqlError("server requires authentication (%s); pass --user/--password" % r.string())
            token = b"\0" + user.encode() + b"\0" + (password or "").encode()
            op, r = conn.request(OP_AUTH_RESPONSE, struct.pack(">i", len(token)) + token)
            if op != OP_AUTH_SUCCESS:
                raise CqlError("authentication failed (opcode 0x%02x)" % op)
        elif op != OP_READY:
            raise CqlError("unexpected reply 0x%02x to STARTUP" % op)

        query = cql_long_string("SELECT release_version FROM system.local")
        query += struct.pack(">HB", CONSISTENCY_ONE, 0)
        op, r = conn.request(OP_QUERY, query)
        if op != OP_RESULT or r.take(">i") != RESULT_ROWS:
            raise CqlError("QUERY did not return rows")
        flags = r.take(">i")
        columns = r.take(">i")
        if flags & FLAG_HAS_MORE_PAGES:
            r.bytes_()
        if not flags & FLAG_NO_METADATA:
            if flags & FLAG_GLOBAL_TABLES_SPEC:
                r.string()
                r.string()
            for _ in range(columns):
                if not flags & FLAG_GLOBAL_TABLES_SPEC:
                    r.string()
                    r.string()
                r.string()
                r.type_option()
        rows = r.take(">i")
        if rows < 1 or columns < 1:
            raise CqlError("system.local returned no row")
        value = r.bytes_()
        if value is None:
            raise CqlError("release_version is null")
        return value.decode("utf-8", "replace")
    finally:
        conn.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9042)
    p.add_argument("--user")
    p.add_argument("--password")
    p.add_argument("--timeout", type=float, default=5.0)
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args()
    try:
        version = release_version(a.host, a.port, a.timeout, a.user, a.password)
    except (OSError, CqlError) as e:
        if a.verbose:
            print("cql_check: %s:%d: %s" % (a.host, a.port, e), file=sys.stderr)
        return 1
    if a.verbose:
        print("cql_check: release_version %s" % version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
