/* A server that unmaps memory while it serves (issue 13, bug 1). Used by tests/probe.rs.

   Listens on 127.0.0.1 (port argv[3] if given, else any free one), writes "ready <port>" to
   argv[1] once serving. It owns one
   anonymous region of REGION bytes. Every request ("x\n") toggles it: a mapped region is
   touched (every page written, as a request handler would) and then unmapped; an unmapped one
   is mapped again (at the same address if that is still free, else anywhere) and touched.
   After every toggle it writes "<mapped 0|1> <address> <length>" to argv[2] (through a rename,
   so a reader never sees half a line), then answers "ok <n>\n". So every other request leaves
   a range that the agent saw mapped before the request unmapped behind its back.

   Single-threaded, poll(2)-based: the agent's wait hooks see it as an event-loop server. */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define REGION (256 * 1024)
#define MAX_CLIENTS 16

static char *region;
static int mapped;
static const char *state_path;

static void write_state(void) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", state_path);
    FILE *f = fopen(tmp, "w");
    if (!f) exit(4);
    fprintf(f, "%d %lu %d\n", mapped, (unsigned long)region, REGION);
    fclose(f);
    if (rename(tmp, state_path) != 0) exit(4);
}

static void touch(void) {
    for (size_t i = 0; i < REGION; i += 4096) region[i] = (char)(region[i] + 1);
}

static void map_region(void *hint) {
    void *p = mmap(hint, REGION, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (hint ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    if (p == MAP_FAILED && hint)
        p = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) exit(3);
    region = p;
    mapped = 1;
    touch();
}

static void toggle(void) {
    if (mapped) {
        touch();
        if (munmap(region, REGION) != 0) exit(5);
        mapped = 0;
    } else {
        map_region(region);
    }
    write_state();
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    state_path = argv[2];
    map_region(NULL);
    write_state();
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (argc > 3) a.sin_port = htons((unsigned short)atoi(argv[3])); /* else any free port */
    socklen_t alen = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 16) != 0) return 6;
    getsockname(l, (struct sockaddr *)&a, &alen);
    FILE *rf = fopen(argv[1], "w");
    if (!rf) return 7;
    fprintf(rf, "ready %d\n", ntohs(a.sin_port));
    fclose(rf);
    struct pollfd fds[1 + MAX_CLIENTS];
    int n = 1;
    fds[0].fd = l;
    fds[0].events = POLLIN;
    unsigned long served = 0;
    for (;;) {
        if (poll(fds, n, -1) < 0) {
            if (errno == EINTR) continue;
            return 8;
        }
        if (fds[0].revents & POLLIN) {
            int c = accept(l, NULL, NULL);
            if (c >= 0 && n < 1 + MAX_CLIENTS) {
                setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                fds[n].fd = c;
                fds[n].events = POLLIN;
                fds[n].revents = 0;
                n++;
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
                toggle();
                char out[64];
                int len = snprintf(out, sizeof out, "ok %lu\n", ++served);
                if (write(fds[i].fd, out, (size_t)len) != len) return 9;
            }
        }
    }
}
