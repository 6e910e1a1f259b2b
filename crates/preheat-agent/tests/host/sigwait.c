/* A host that takes SIGHUP through a signalfd (as event loops do; sigwait-based signal threads
   such as MariaDB's are the same case whenever the signal arrives while they are not waiting):
   it blocks SIGHUP, prints "blocked", and polls the signalfd for up to 10 s. Exits 0 after
   printing "got SIGHUP", 1 on timeout; killed by SIGHUP if the kernel delivered the signal to a
   thread that does not block it. Used by tests/host.rs. */
#define _GNU_SOURCE
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/signalfd.h>
#include <unistd.h>

int main(void) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    int fd = signalfd(-1, &s, SFD_CLOEXEC);
    if (fd < 0) return 2;
    printf("blocked\n");
    fflush(stdout);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    struct signalfd_siginfo si;
    if (poll(&p, 1, 10000) == 1 && read(fd, &si, sizeof si) == sizeof si && si.ssi_signo == SIGHUP) {
        printf("got SIGHUP\n");
        return 0;
    }
    return 1;
}
