"""A selectors (epoll) event-loop server for preheat-observe's tests: each read ("ping\n") is
answered with "pong\n". Usage: [SENDS=K] event_loop.py PORT (SENDS: each reply is K sends, the
first K-1 of them empty: a busy period with more calls than the observer's per-thread slot
holds; TICK_MS=T: the loop also wakes every T ms with nothing to do; DRAIN=1: after each
reply, read again until the socket says EAGAIN, as many event loops do)"""
import selectors
import socket
import os
import sys

SENDS = int(os.environ.get("SENDS", "1"))
# TICK_MS: wake every that many ms with nothing to do (a timer's empty busy periods).
TICK = float(os.environ["TICK_MS"]) / 1000 if "TICK_MS" in os.environ else None
DRAIN = os.environ.get("DRAIN") == "1"


def answer(s, data):
    """One reply per request ("ping\n") in data; each reply SENDS sends."""
    for _ in range(max(1, data.count(b"\n"))):
        for _ in range(SENDS - 1):
            s.send(b"")
        s.send(b"pong\n")


sel = selectors.DefaultSelector()
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(64)
ls.setblocking(False)
sel.register(ls, selectors.EVENT_READ)
while True:
    for key, _ in sel.select(TICK):
        s = key.fileobj
        if s is ls:
            c, _ = ls.accept()
            c.setblocking(False)
            sel.register(c, selectors.EVENT_READ)
            continue
        data = s.recv(4096)
        if not data:
            sel.unregister(s)
            s.close()
            continue
        answer(s, data)
        if DRAIN:
            try:
                # Usually nothing there yet: EAGAIN. Should the next request be there already,
                # it is answered like any other.
                more = s.recv(4096)
                if more:
                    answer(s, more)
            except BlockingIOError:
                pass
