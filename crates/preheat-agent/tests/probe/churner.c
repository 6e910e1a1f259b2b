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

/* Answer "ok\n" to every line on 127.0.0.1:port until `secs` seconds passed. */
static void serve(int port, long secs) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((unsigned short)port)};
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 16) != 0) exit(6);
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
            char buf[512];
            ssize_t r = read(fds[i].fd, buf, sizeof buf);
            if (r <= 0) {
                close(fds[i].fd);
                fds[i] = fds[--n];
                continue;
            }
            for (ssize_t k = 0; k < r; k++)
                if (buf[k] == '\n' && write(fds[i].fd, "ok\n", 3) != 3) exit(9);
        }
    }
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
