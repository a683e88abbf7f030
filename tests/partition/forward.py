#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A TCP forwarder for the partition tests, the way a load balancer sits
between a relay and a broker. Each argument LISTEN_HOST:PORT=TARGET_HOST:
TARGET_PORT listens on LISTEN_HOST (PORT 0: a free one) and copies bytes
both ways to TARGET_HOST:TARGET_PORT; the listening ports are printed on
one line, in the order given. When the relay's side of a link goes dark,
the forwarder's connection to the broker stays open and silent, as a
middlebox's would: only heartbeats and timeouts can tell either end.

Usage: forward.py LISTEN_HOST:PORT=TARGET_HOST:TARGET_PORT ...
"""
import selectors
import socket
import sys


def split_addr(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


def main():
    sel = selectors.DefaultSelector()
    ports = []
    for spec in sys.argv[1:]:
        listen, _, target = spec.partition("=")
        if not target:
            sys.exit("forward.py: expected LISTEN:PORT=TARGET:PORT, got "
                     + spec)
        lsock = socket.socket()
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind(split_addr(listen))
        lsock.listen(64)
        ports.append(str(lsock.getsockname()[1]))
        sel.register(lsock, selectors.EVENT_READ, split_addr(target))
    print(" ".join(ports), flush=True)
    peer = {}
    while True:
        for key, _ in sel.select():
            if key.data != "c":
                down, _ = key.fileobj.accept()
                try:
                    up = socket.create_connection(key.data, 5)
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
