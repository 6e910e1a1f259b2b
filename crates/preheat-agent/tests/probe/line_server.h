/* The poll(2) line server the probe's test programs share (churner.c, parker.c, unmapper.c):
   one thread answers every line on 127.0.0.1 with what `answer` writes (TCP_NODELAY, at most
   16 connections), until `secs` seconds passed (forever if `secs` < 0). An event-loop server
   to the agent (it waits in poll). */
#ifndef PREHEAT_LINE_SERVER_H
#define PREHEAT_LINE_SERVER_H

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Writes the reply to one line into `out` (at most `cap` bytes); returns its length. */
typedef int (*line_answer)(char *out, size_t cap);

/* A listening socket on 127.0.0.1:port (0: an ephemeral port); its port in *bound. Exits 6 on
   failure. */
static int listen_loopback(int port, int *bound) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((unsigned short)port)};
    socklen_t alen = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 16) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &alen) != 0)
        exit(6);
    *bound = ntohs(a.sin_port);
    return l;
}

static void serve_lines(int l, long secs, line_answer answer) {
    struct pollfd fds[17] = {{.fd = l, .events = POLLIN}};
    int n = 1, one = 1;
    time_t end = time(NULL) + secs;
    while (secs < 0 || time(NULL) < end) {
        int ready = poll(fds, (nfds_t)n, 1000);
        if (ready < 0 && errno != EINTR) exit(8);
        if (ready <= 0) continue;
        if (fds[0].revents & POLLIN) {
            int c = accept(l, NULL, NULL);
            if (c >= 0 && n < 17) {
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                fds[n++] = (struct pollfd){.fd = c, .events = POLLIN};
            } else if (c >= 0) {
                close(c);
            }
        }
        for (int i = n - 1; i >= 1; i--) {
            if (!fds[i].revents) continue;
            char buf[512];
            ssize_t r = read(fds[i].fd, buf, sizeof buf);
            if (r <= 0) {
                close(fds[i].fd);
                fds[i] = fds[--n];
                continue;
            }
            for (ssize_t k = 0; k < r; k++) {
                if (buf[k] != '\n') continue;
                char out[64];
                int m = answer(out, sizeof out);
                if (write(fds[i].fd, out, (size_t)m) != m) exit(9);
            }
        }
    }
}

#endif
