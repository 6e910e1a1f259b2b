/* A server with a thread the agent sees wait once and then never again (issue 23: a JVM's
   worker that once waited in epoll_wait parks on a futex from then on). Used by
   tests/probe.rs.

   * A second thread calls poll(2) once (so the agent tracks it as a server thread), then
     blocks forever in pthread_cond_wait: outside every wait call the agent hooks, never
     running.
   * The main thread serves 127.0.0.1 on an ephemeral port with poll(2), answering "ok <sum>\n"
     to every line after reading a 256 KiB buffer (the data a probe finds).

   Writes "ready <port> <buffer start> <buffer length>" to argv[1]. Exits after argv[2] seconds
   (default 120). */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUF_LEN (256 * 1024)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t never = PTHREAD_COND_INITIALIZER;
static volatile int parked;

static void *park(void *arg) {
    (void)arg;
    poll(NULL, 0, 1);
    pthread_mutex_lock(&mu);
    __atomic_store_n(&parked, 1, __ATOMIC_RELEASE);
    for (;;) pthread_cond_wait(&never, &mu);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    long secs = argc > 2 ? atol(argv[2]) : 120;
    static char buf[BUF_LEN];
    for (size_t i = 0; i < BUF_LEN; i += 64) buf[i] = (char)i;
    pthread_t t;
    if (pthread_create(&t, NULL, park, NULL) != 0) return 4;
    while (!__atomic_load_n(&parked, __ATOMIC_ACQUIRE)) usleep(1000);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 16) != 0 ||
        getsockname(l, (struct sockaddr *)&a, &alen) != 0)
        return 6;
    FILE *rf = fopen(argv[1], "w");
    if (!rf) return 7;
    fprintf(rf, "ready %d %lu %d\n", ntohs(a.sin_port), (unsigned long)buf, BUF_LEN);
    fclose(rf);
    struct pollfd fds[17] = {{.fd = l, .events = POLLIN}};
    int n = 1;
    time_t end = time(NULL) + secs;
    while (time(NULL) < end) {
        if (poll(fds, (nfds_t)n, 1000) <= 0) continue;
        if ((fds[0].revents & POLLIN) && n < 17) {
            int c = accept(l, NULL, NULL);
            if (c >= 0) fds[n++] = (struct pollfd){.fd = c, .events = POLLIN};
        }
        for (int i = n - 1; i >= 1; i--) {
            if (!fds[i].revents) continue;
            char in[512];
            ssize_t r = read(fds[i].fd, in, sizeof in);
            if (r <= 0) {
                close(fds[i].fd);
                fds[i] = fds[--n];
                continue;
            }
            for (ssize_t k = 0; k < r; k++) {
                if (in[k] != '\n') continue;
                unsigned sum = 0;
                for (size_t j = 0; j < BUF_LEN; j += 64) sum += (unsigned char)buf[j];
                char out[32];
                int m = snprintf(out, sizeof out, "ok %u\n", sum);
                if (write(fds[i].fd, out, (size_t)m) != m) exit(9);
            }
        }
    }
    return 0;
}
