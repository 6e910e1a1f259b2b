/* A single-threaded host that inherits a connected socket as fd 3 and closes fds whose numbers
   the agent's own table also uses. Commands, one per line on stdin, each answered by one line:
     open     open /dev/null until fd 31 is taken (fds 4..31): "opened"
     close    close 3..31 one by one through close(2), check each is gone: "closed" or "FAIL ..."
     range    open 4..31 again, close_range(4, ~0U, 0), check: "ranged" or "FAIL ..."
     from     open 4..31 again, closefrom(4), check: "closedfrom" or "FAIL ..."
     fork     fork; the child opens /dev/zero and sleeps 30 s: "child <pid>"
     quit     exit 0
   Used by tests/host.rs (the agent's threads on a file table of their own). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define LAST 31

/* glibc >= 2.34 declares these; declared here so older headers compile (the agent interposes
   them by name). */
int close_range(unsigned int first, unsigned int last, int flags);
void closefrom(int lowfd);

static int open_up_to_last(void) {
    for (;;) {
        int fd = open("/dev/null", O_RDONLY);
        if (fd < 0) return -1;
        if (fd >= LAST) return 0;
    }
}

/* Every fd in [from, LAST] is closed in this (the host's) table. */
static int all_closed(int from, char *why, size_t n) {
    for (int fd = from; fd <= LAST; fd++) {
        if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) {
            snprintf(why, n, "FAIL fd %d still open", fd);
            return 0;
        }
    }
    return 1;
}

int main(void) {
    char line[64], why[64];
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        if (!strcmp(line, "open\n")) {
            printf(open_up_to_last() == 0 ? "opened\n" : "FAIL open\n");
        } else if (!strcmp(line, "close\n")) {
            int bad = 0;
            for (int fd = 3; fd <= LAST; fd++) {
                if (close(fd) != 0) {
                    printf("FAIL close(%d): %s\n", fd, strerror(errno));
                    bad = 1;
                    break;
                }
            }
            if (!bad) printf(all_closed(3, why, sizeof why) ? "closed\n" : "%s\n", why);
        } else if (!strcmp(line, "range\n")) {
            if (open_up_to_last() != 0 || close_range(4, ~0U, 0) != 0)
                printf("FAIL close_range: %s\n", strerror(errno));
            else
                printf(all_closed(4, why, sizeof why) ? "ranged\n" : "%s\n", why);
        } else if (!strcmp(line, "from\n")) {
            if (open_up_to_last() != 0) {
                printf("FAIL open\n");
                continue;
            }
            closefrom(4);
            printf(all_closed(4, why, sizeof why) ? "closedfrom\n" : "%s\n", why);
        } else if (!strcmp(line, "fork\n")) {
            pid_t pid = fork();
            if (pid == 0) {
                int fd = open("/dev/zero", O_RDONLY);
                (void)fd;
                sleep(30);
                _exit(0);
            }
            printf("child %d\n", (int)pid);
        } else if (!strcmp(line, "quit\n")) {
            return 0;
        }
    }
    return 0;
}
