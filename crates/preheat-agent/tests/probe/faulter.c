/* A host that faults on its own while the agent probes it: its faults must go exactly where
   they go without the agent (issue 20, point 5). Used by tests/probe.rs.

   argv[1]: ready file; argv[2]: mode; argv[3]: "agent" (wait, before each fault, until the
   agent's handler is the kernel's disposition: a probe pass is running) or "alone" (no agent:
   fault at once). It writes "ready <start> <length>" (a 256 KiB buffer of its own, for the
   probe) to argv[1], then, in a thread of its own:

     dfl      - no handler: read a PROT_NONE page. Must die of SIGSEGV.
     ign      - SIGSEGV ignored (signal(SIGSEGV, SIG_IGN)): the same read. Must die of SIGSEGV.
     handlers - its own handlers: SIGSEGV with sigaction (SA_SIGINFO | SA_ONSTACK, sa_mask
                {SIGUSR1}) on an alternate stack, SIGBUS with signal() (BSD semantics: no
                SA_SIGINFO, sa_mask {SIGBUS}, normal stack). It reads the PROT_NONE page or past
                the end of a memfd mapping (in turn), FAULTS times alone, with the agent until
                FAULTS faults reached a handler through the agent's (at most 10 * FAULTS); each
                handler checks what the kernel would have given it (signal, si_code, si_addr,
                stack, blocked signals) and siglongjmps back. Must print "ok <faults> <through
                the agent>" and exit 0.
     oneshot  - SIGSEGV handler with SA_RESETHAND | SA_SIGINFO: the first fault reaches it
                ("handled" on stderr), the second must kill the process with SIGSEGV.

   Before every fault it says on stderr whether the agent's handler was in the kernel
   ("agent-handler 1" / "agent-handler 0": raw rt_sigaction, which the agent does not
   interpose). Core dumps are off (RLIMIT_CORE 0), so a killed run leaves nothing behind. */
#define _GNU_SOURCE
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define FAULTS 40

/* The kernel's sigaction layout (for the raw system call). */
struct ksigaction {
    void *handler;
    unsigned long flags;
    void *restorer;
    uint64_t mask;
};

static int with_agent;
static char *noaccess;       /* a PROT_NONE page */
static char *past_eof;       /* a page of a memfd mapping past the end of the file */
static char *altstack;
static size_t altstack_len = 64 * 1024;
static sigjmp_buf back;
static volatile sig_atomic_t bad;      /* first failed check (exit status) */
static volatile sig_atomic_t through;  /* faults delivered while the agent's handler was in */
static volatile void *expect_addr;

static void *kernel_handler(int sig) {
    struct ksigaction k;
    if (syscall(SYS_rt_sigaction, sig, NULL, &k, 8) != 0) return NULL;
    return k.handler;
}

/* Wait (at most 20 s) until the kernel's handler for `sig` is not `mine`: the agent holds it. */
static int wait_for_agent(int sig, void *mine) {
    if (!with_agent) return 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (kernel_handler(sig) != mine) return 1;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 20) return 0;
    }
}

static void say_agent(int in) {
    const char *m = in ? "agent-handler 1\n" : "agent-handler 0\n";
    if (write(2, m, strlen(m)) < 0) _exit(9);
}

static int blocked(int sig) {
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    return sigismember(&cur, sig);
}

static void fail(int code) {
    if (!bad) bad = code;
}

static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    char here;
    if (sig != SIGSEGV) fail(20);
    if (si->si_code != SEGV_ACCERR) fail(21);
    if (si->si_addr != expect_addr) fail(22);
    if (&here < altstack || &here >= altstack + altstack_len) fail(23); /* SA_ONSTACK */
    if (!blocked(SIGUSR1)) fail(24);                                       /* sa_mask */
    if (!blocked(SIGSEGV)) fail(25);                                       /* no SA_NODEFER */
    if (kernel_handler(SIGSEGV) != (void *)on_segv) through++;
    siglongjmp(back, 1);
}

static void on_bus(int sig) {
    char here;
    if (sig != SIGBUS) fail(30);
    if (&here >= altstack && &here < altstack + altstack_len) fail(33); /* no SA_ONSTACK */
    if (!blocked(SIGBUS)) fail(35);
    if (blocked(SIGUSR1)) fail(34);
    if (kernel_handler(SIGBUS) != (void *)on_bus) through++;
    siglongjmp(back, 1);
}

static volatile int oneshot_handled;
static void on_segv_once(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)si; (void)uc;
    oneshot_handled = 1;
    if (write(2, "handled\n", 8) < 0) _exit(9);
    siglongjmp(back, 1);
}

static void read_byte(volatile char *p) {
    expect_addr = p;
    (void)*p;
}

static const char *mode;

static void *run(void *arg) {
    (void)arg;
    if (!strcmp(mode, "dfl") || !strcmp(mode, "ign")) {
        int ign = !strcmp(mode, "ign");
        if (ign) signal(SIGSEGV, SIG_IGN);
        say_agent(wait_for_agent(SIGSEGV, ign ? (void *)SIG_IGN : (void *)SIG_DFL));
        read_byte(noaccess);
        _exit(10); /* still alive: wrong */
    }
    if (!strcmp(mode, "handlers")) {
        stack_t ss = {.ss_sp = altstack, .ss_size = altstack_len, .ss_flags = 0};
        if (sigaltstack(&ss, NULL) != 0) _exit(11);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
        sigemptyset(&sa.sa_mask);
        sigaddset(&sa.sa_mask, SIGUSR1);
        if (sigaction(SIGSEGV, &sa, NULL) != 0) _exit(12);
        if (signal(SIGBUS, on_bus) == SIG_ERR) _exit(13);
        /* The program sees its own dispositions, whoever holds the kernel's. */
        struct sigaction q;
        if (sigaction(SIGSEGV, NULL, &q) != 0 || q.sa_sigaction != on_segv) _exit(14);
        /* With the agent: until FAULTS faults went through its handler (a pass can end between
           the check and the fault: that fault reaches the handler straight from the kernel). */
        int seen = 0;
        for (int i = 0; with_agent ? through < FAULTS && i < 10 * FAULTS : i < FAULTS; i++) {
            int bus = i % 2;
            say_agent(wait_for_agent(bus ? SIGBUS : SIGSEGV,
                                     bus ? (void *)on_bus : (void *)on_segv));
            if (sigsetjmp(back, 1) == 0) {
                read_byte(bus ? past_eof : noaccess);
                _exit(15); /* the access did not fault */
            }
            seen++;
            if (bad) _exit(bad);
        }
        printf("ok %d %d\n", seen, (int)through);
        fflush(stdout);
        _exit(0);
    }
    if (!strcmp(mode, "oneshot")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv_once;
        sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
        if (sigaction(SIGSEGV, &sa, NULL) != 0) _exit(12);
        for (int i = 0; i < 2; i++) {
            say_agent(wait_for_agent(SIGSEGV, i == 0 ? (void *)on_segv_once : (void *)SIG_DFL));
            if (sigsetjmp(back, 1) == 0) read_byte(noaccess);
        }
        _exit(16); /* the second fault did not kill it */
    }
    _exit(2);
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    mode = argv[2];
    with_agent = !strcmp(argv[3], "agent");
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    size_t buf_len = 256 * 1024;
    char *buf = mmap(NULL, buf_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    noaccess = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    altstack = mmap(NULL, altstack_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int fd = memfd_create("faulter", 0);
    if (buf == MAP_FAILED || noaccess == MAP_FAILED || altstack == MAP_FAILED || fd < 0) return 3;
    if (ftruncate(fd, 4096) != 0) return 3;
    char *f = mmap(NULL, 2 * 4096, PROT_READ, MAP_SHARED, fd, 0);
    if (f == MAP_FAILED) return 3;
    past_eof = f + 4096;
    memset(buf, 1, buf_len);
    FILE *rf = fopen(argv[1], "w");
    if (!rf) return 7;
    fprintf(rf, "ready %lu %lu\n", (unsigned long)buf, (unsigned long)buf_len);
    fclose(rf);
    pthread_t t;
    if (pthread_create(&t, NULL, run, NULL) != 0) return 4;
    pthread_join(t, NULL);
    return 0;
}
