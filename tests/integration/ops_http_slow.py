#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Slow HTTP clients against the relay's HTTP port (ops_http_slow.sh).

Usage: ops_http_slow.py PORT

Slow clients open a connection, send a request line and then one header
line a second, never finishing the request, and connect again whenever
the server closes them. Meanwhile /healthz is asked every 0.25 s from
127.0.0.1; every answer must be 200 within PROBE_LIMIT_S. Three phases,
each bounded in time and in the number of clients:

  deadline  one slow client alone: the server closes it once its
            header has taken more than 5 s and another client arrives;
  spread    200 slow clients from 20 loopback addresses (10 each, under
            the per-address limit): more than the 64 connections served
            at once;
  same      200 slow clients from 127.0.0.1, the probe's own address:
            far over the 16 connections allowed per address.

Prints one line per phase with the measured probe times; exits 1 on
any failure.
"""
import selectors
import socket
import sys
import threading
import time

PROBE_LIMIT_S = 5.0  # generous: the machine is loaded; measured time printed
PHASE_S = 8.0
HEADER_EVERY_S = 1.0
RECONNECT_DELAY_S = 0.2
MAX_CONNECTS = 20000  # bound on reconnects per phase


class Slow:
    """One slow client: connects from src and never finishes its request."""

    def __init__(self, src, port):
        self.src, self.port = src, port
        self.sock = None
        self.next_at = 0.0
        self.closed_by_server = 0

    def connect(self, sel):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((self.src, 0))
        s.connect_ex(("127.0.0.1", self.port))
        self.sock = s
        self.sent_line = False
        self.next_at = time.monotonic()
        sel.register(s, selectors.EVENT_READ, self)

    def drop(self, sel):
        if self.sock is not None:
            sel.unregister(self.sock)
            self.sock.close()
            self.sock = None
        self.next_at = time.monotonic() + RECONNECT_DELAY_S

    def tick(self, sel, now):
        if self.sock is None or now < self.next_at:
            return
        try:
            if not self.sent_line:
                self.sock.send(b"GET /healthz HTTP/1.1\r\nHost: relay\r\n")
                self.sent_line = True
            else:
                self.sock.send(b"X-Slow: 1\r\n")
        except BlockingIOError:
            pass  # not connected yet: try again next tick
        except OSError:
            self.closed_by_server += 1
            self.drop(sel)
            return
        self.next_at = now + HEADER_EVERY_S


def probe(port):
    """GET /healthz from 127.0.0.1: (status line or error, seconds)."""
    t0 = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PROBE_LIMIT_S) as s:
            s.settimeout(max(0.1, PROBE_LIMIT_S - (time.monotonic() - t0)))
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: relay\r\nConnection: close\r\n\r\n")
            data = b""
            while b"\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        line = data.split(b"\r\n", 1)[0].decode(errors="replace") or "connection closed"
    except OSError as e:
        line = "error: %s" % e
    return line, time.monotonic() - t0


def run_phase(name, port, sources, per_source, watch_first=False):
    sel = selectors.DefaultSelector()
    clients = [Slow(src, port) for src in sources for _ in range(per_source)]
    connects = 0
    for c in clients:
        c.connect(sel)
        connects += 1
    probes, failures = [], []
    stop = threading.Event()

    def prober():
        # Alone, the slow client first has to outlive the header deadline.
        if watch_first:
            time.sleep(6.0)
        while not stop.is_set():
            line, secs = probe(port)
            probes.append(secs)
            if not line.startswith("HTTP/1.1 200") or secs > PROBE_LIMIT_S:
                failures.append("%s after %.2fs" % (line, secs))
            stop.wait(0.25)

    t = threading.Thread(target=prober)
    t.start()
    end = time.monotonic() + PHASE_S + (7.0 if watch_first else 0.0)
    while time.monotonic() < end:
        for key, _ in sel.select(timeout=0.05):
            c = key.data
            try:
                data = c.sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                c.closed_by_server += 1
                c.drop(sel)
        now = time.monotonic()
        for c in clients:
            if c.sock is None and now >= c.next_at and connects < MAX_CONNECTS:
                c.connect(sel)
                connects += 1
            c.tick(sel, now)
    stop.set()
    t.join()
    for c in clients:
        c.drop(sel)
    closed = sum(c.closed_by_server for c in clients)
    probes.sort()
    if not probes:
        failures.append("no probe ran")
    else:
        print("%s: %d slow clients, %d connects, %d closed by the server; "
              "%d probes, median %.3fs, max %.3fs" %
              (name, len(clients), connects, closed, len(probes),
               probes[len(probes) // 2], probes[-1]))
    if watch_first and closed == 0:
        failures.append("the lone slow client was never closed")
    if not watch_first and closed == 0:
        failures.append("no slow client was closed to make room")
    return ["%s: %s" % (name, f) for f in failures]


def main():
    port = int(sys.argv[1])
    failures = []
    failures += run_phase("deadline", port, ["127.0.0.1"], 1, watch_first=True)
    failures += run_phase("spread", port, ["127.0.0.%d" % i for i in range(2, 22)], 10)
    failures += run_phase("same", port, ["127.0.0.1"], 200)
    for f in failures[:20]:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
