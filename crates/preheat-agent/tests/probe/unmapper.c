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
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "line_server.h"

#define REGION (256 * 1024)

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

static unsigned long served;

/* Toggle the region, then "ok <requests so far>\n". */
static int answer_toggle(char *out, size_t cap) {
    toggle();
    return snprintf(out, cap, "ok %lu\n", ++served);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    state_path = argv[2];
    map_region(NULL);
    write_state();
    int port;
    int l = listen_loopback(argc > 3 ? atoi(argv[3]) : 0, &port);
    FILE *rf = fopen(argv[1], "w");
    if (!rf) return 7;
    fprintf(rf, "ready %d\n", port);
    fclose(rf);
    serve_lines(l, -1, answer_toggle);
    return 0;
}
