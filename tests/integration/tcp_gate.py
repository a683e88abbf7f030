#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A loopback TCP forwarder that holds every connection until a file exists.

Usage: tcp_gate.py PORT UPSTREAM_PORT GATE_FILE

Accepts on 127.0.0.1:PORT at once, but connects each client to
127.0.0.1:UPSTREAM_PORT only once GATE_FILE exists: a test decides when a
session behind it (the relay's LISTEN session, relay_sources_idle.sh)
comes up; says on stderr when it holds one. Bounded: it serves at most
MAX_CONNS connections and exits after LIFETIME_S.
"""
import os
import socket
import sys
import threading
import time

MAX_CONNS = 200
LIFETIME_S = 300.0


def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(client, upstream_port, gate):
    if not os.path.exists(gate):
        # A test waits for this to know a client is held.
        print("holding a connection", file=sys.stderr, flush=True)
    while not os.path.exists(gate):
        time.sleep(0.05)
    try:
        up = socket.create_connection(("127.0.0.1", upstream_port))
    except OSError:
        client.close()
        return
    threading.Thread(target=pipe, args=(up, client), daemon=True).start()
    pipe(client, up)


def main():
    port, upstream_port, gate = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    srv.listen(16)
    srv.settimeout(1.0)
    deadline = time.monotonic() + LIFETIME_S
    served = 0
    while served < MAX_CONNS and time.monotonic() < deadline:
        try:
            client, _ = srv.accept()
        except socket.timeout:
            continue
        served += 1
        threading.Thread(
            target=serve, args=(client, upstream_port, gate), daemon=True
        ).start()
    # Connections already forwarded run until the test kills this process.
    while time.monotonic() < deadline:
        time.sleep(1.0)


if __name__ == "__main__":
    main()
