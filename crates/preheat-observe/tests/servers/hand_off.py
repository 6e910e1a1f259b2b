"""A hand-off server for preheat-observe's tests: per connection, a reader thread blocks in
recv and queues each request; one writer thread takes it from the queue and sends "pong\n".
Usage: hand_off.py PORT"""
import queue
import socket
import sys
import threading

q = queue.Queue()


def writer():
    while True:
        conn, _req = q.get()
        conn.sendall(b"pong\n")


def reader(conn):
    while True:
        data = conn.recv(4096)
        if not data:
            return
        q.put((conn, data))


threading.Thread(target=writer, name="writer", daemon=True).start()
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(64)
while True:
    c, _ = ls.accept()
    threading.Thread(target=reader, args=(c,), name="reader", daemon=True).start()
