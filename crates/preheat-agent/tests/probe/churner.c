/* A host with a thread that changes its mappings in a tight loop, whatever the agent does
   (issue 20, point 5). Used by tests/probe.rs.

   One thread, forever (until argv[2] seconds passed, default 120, then exit 0):
     * an anonymous region at a fixed address: map 256 KiB, 512 KiB, 1 MiB (in turn), touch
       every page, unmap;
     * a 256 KiB shared memfd mapping: touch every page, truncate the file to 0 (its pages are
       then past the end of the file: a load there is a SIGBUS), extend it again.
   The agent tracks no such thread (it never waits in a hooked call), so nothing keeps it quiet
   while the probe passes over the two ranges: a probe line can vanish between the agent's
   validation and its load or flush.

   Writes "ready <anon start> <anon max length> <file start> <file length>" to argv[1]. With a
   port (argv[3]) the main thread also serves 127.0.0.1:<port>, answering "ok\n" to every line
   (for `preheat record --backend probe`; poll(2)-based, an event-loop server to the agent). */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "line_server.h"

#define ANON_MAX (1024 * 1024)
#define FILE_LEN (256 * 1024)

static char *anon;
static char *file;
static int fd;
static volatile int go;

static void touch(char *p, size_t len) {
    for (size_t i = 0; i < len; i += 4096) p[i] = (char)(p[i] + 1);
}

static void *churn(void *arg) {
    (void)arg;
    size_t sizes[] = {256 * 1024, 512 * 1024, ANON_MAX};
    while (!__atomic_load_n(&go, __ATOMIC_ACQUIRE)) {
    }
    for (unsigned long n = 0;; n++) {
        size_t len = sizes[n % 3];
        char *p = mmap(anon, len, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        if (p != MAP_FAILED) {
            if (p != anon) { /* an old kernel ignores MAP_FIXED_NOREPLACE: never keep it */
                munmap(p, len);
            } else {
                touch(p, len);
                munmap(p, len);
            }
        }
        touch(file, FILE_LEN);
        if (ftruncate(fd, 0) != 0 || ftruncate(fd, FILE_LEN) != 0) exit(5);
    }
    return NULL;
}

static int answer_ok(char *out, size_t cap) {
    (void)cap;
    out[0] = 'o', out[1] = 'k', out[2] = '\n';
    return 3;
}

/* Answer "ok\n" to every line on 127.0.0.1:port until `secs` seconds passed. */
static void serve(int port, long secs) {
    int bound;
    serve_lines(listen_loopback(port, &bound), secs, answer_ok);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    long secs = argc > 2 ? atol(argv[2]) : 120;
    /* The thread (its stack) and the file first, then the hole for the anonymous region: a
       mapping made later could land in the hole. One that lands there meanwhile (a large
       allocation of the agent's, say) only makes the churner skip turns
       (MAP_FIXED_NOREPLACE fails) until it is gone. */
    pthread_t t;
    if (pthread_create(&t, NULL, churn, NULL) != 0) return 4;
    fd = memfd_create("churner", 0);
    if (fd < 0 || ftruncate(fd, FILE_LEN) != 0) return 3;
    file = mmap(NULL, FILE_LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (file == MAP_FAILED) return 3;
    touch(file, FILE_LEN);
    anon = mmap(NULL, ANON_MAX, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (anon == MAP_FAILED || munmap(anon, ANON_MAX) != 0) return 3;
    __atomic_store_n(&go, 1, __ATOMIC_RELEASE);
    FILE *rf = fopen(argv[1], "w");
    if (!rf) return 7;
    fprintf(rf, "ready %lu %d %lu %d\n", (unsigned long)anon, ANON_MAX, (unsigned long)file,
            FILE_LEN);
    fclose(rf);
    if (argc > 3) serve(atoi(argv[3]), secs);
    else sleep((unsigned)secs);
    return 0;
}
