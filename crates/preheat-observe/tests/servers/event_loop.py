"""A selectors (epoll) event-loop server for preheat-observe's tests: each read ("ping\n") is
answered with "pong\n". Usage: event_loop.py PORT"""
import selectors
import socket
import sys

sel = selectors.DefaultSelector()
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(64)
ls.setblocking(False)
sel.register(ls, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
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
        s.send(b"pong\n")
