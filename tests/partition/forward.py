#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A TCP forwarder for the partition tests, the way a load balancer sits
between a relay and a broker: it listens on LISTEN_HOST (a free port),
prints that port, and copies bytes both ways to 127.0.0.1:TARGET_PORT.
When the relay's side of a link goes dark, the forwarder's connection to
the broker stays open and silent, as a middlebox's would: only heartbeats
can tell the broker.

Usage: forward.py LISTEN_HOST TARGET_PORT
"""
import selectors
import socket
import sys


def main():
    host, target = sys.argv[1], int(sys.argv[2])
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((host, 0))
    lsock.listen(64)
    print(lsock.getsockname()[1], flush=True)
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ, None)
    peer = {}
    while True:
        for key, _ in sel.select():
            if key.data is None:
                down, _ = lsock.accept()
                try:
                    up = socket.create_connection(("127.0.0.1", target), 5)
                except OSError:
                    down.close()
                    continue
                # A dead peer must not stall the others: a write that
                # cannot finish in 5 s ends its connection pair.
                down.settimeout(5)
                up.settimeout(5)
                peer[down], peer[up] = up, down
                sel.register(down, selectors.EVENT_READ, "c")
                sel.register(up, selectors.EVENT_READ, "c")
                continue
            s = key.fileobj
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            other = peer.get(s)
            if data and other is not None:
                try:
                    other.sendall(data)
                    continue
                except OSError:
                    pass
            for x in (s, other):
                if x is not None and x in peer:
                    sel.unregister(x)
                    peer.pop(x, None)
                    x.close()


if __name__ == "__main__":
    main()
