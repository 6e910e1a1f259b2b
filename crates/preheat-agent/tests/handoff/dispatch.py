# A server whose requests are read and answered by a pool thread, as the JDK's HttpServer does
# (issue 23): a dispatcher thread waits in epoll for the listening socket and the connections,
# accepts, and hands a readable connection to a worker thread through a queue; the worker reads
# the request ("ping\n"), answers "pong\n", gives the connection back to the dispatcher, and
# parks on the queue (a futex: no read, no wait call the agent hooks).
# Usage: python3 dispatch.py READY_FILE (listens on 127.0.0.1, an ephemeral port).
import queue
import select
import socket
import sys
import threading

ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("127.0.0.1", 0))
ls.listen(16)
ep = select.epoll()
ep.register(ls.fileno(), select.EPOLLIN)
conns = {}
work = queue.Queue()


def worker():
    while True:
        c = work.get()
        data = b""
        while not data.endswith(b"\n"):
            chunk = c.recv(64)
            if not chunk:
                c.close()
                break
            data += chunk
        else:
            c.sendall(b"pong\n")
            ep.register(c.fileno(), select.EPOLLIN | select.EPOLLONESHOT)


threading.Thread(target=worker, daemon=True).start()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("ready %d\n" % ls.getsockname()[1])
import os

os.rename(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    for fd, _ in ep.poll():
        if fd == ls.fileno():
            c, _ = ls.accept()
            conns[c.fileno()] = c
            ep.register(c.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
        else:
            ep.unregister(fd)
            work.put(conns[fd])
