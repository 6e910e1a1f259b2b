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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "line_server.h"

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

static char buf[BUF_LEN];

/* "ok <sum of a byte of every line of buf>\n" */
static int answer_sum(char *out, size_t cap) {
    unsigned sum = 0;
    for (size_t j = 0; j < BUF_LEN; j += 64) sum += (unsigned char)buf[j];
    return snprintf(out, cap, "ok %u\n", sum);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    long secs = argc > 2 ? atol(argv[2]) : 120;
    for (size_t i = 0; i < BUF_LEN; i += 64) buf[i] = (char)i;
    pthread_t t;
    if (pthread_create(&t, NULL, park, NULL) != 0) return 4;
    while (!__atomic_load_n(&parked, __ATOMIC_ACQUIRE)) usleep(1000);
    int port;
    int l = listen_loopback(0, &port);
    FILE *rf = fopen(argv[1], "w");
    if (!rf) return 7;
    fprintf(rf, "ready %d %lu %d\n", port, (unsigned long)buf, BUF_LEN);
    fclose(rf);
    serve_lines(l, secs, answer_sum);
    return 0;
}
