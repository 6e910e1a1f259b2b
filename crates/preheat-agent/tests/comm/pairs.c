/* Two pairs of threads; each pair shares (writes) a 64 KiB buffer, nothing is shared across pairs.
   Runs for argv[1] ms. Used by the agent's communication-detection tests. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static long run_ms = 1500;
static volatile uint64_t *bufs[2];
static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static void *worker(void *arg) {
    long id = (long)arg; volatile uint64_t *b = bufs[id / 2];
    char name[16]; snprintf(name, sizeof name, "pair%ld-t%ld", id / 2, id % 2); pthread_setname_np(pthread_self(), name);
    double end = now_ms() + run_ms; uint64_t x = 0;
    while (now_ms() < end)
        for (int i = (int)(id % 2); i < 8192; i += 2) { b[i] += ++x; }
    return NULL;
}
int main(int argc, char **argv) {
    if (argc > 1) run_ms = atol(argv[1]);
    for (int p = 0; p < 2; p++) {
        bufs[p] = mmap(NULL, 65536, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (bufs[p] == MAP_FAILED) return 3;
    }
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    printf("done\n");
    return 0;
}
