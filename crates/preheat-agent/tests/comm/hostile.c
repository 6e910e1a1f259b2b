/* A host program that does everything the communication detector must leave alone.
   Modes (argv[1]):
     segv     - share memory between threads for a while, then write to a read-only page:
                must die of SIGSEGV exactly as without the agent.
     handler  - its own SA_SIGINFO SIGSEGV handler maps pages on demand (mprotect from the
                handler); threads touch them while sampling runs: must exit 0, every fault seen once.
     sigsegv-user - raise(SIGSEGV) with the default disposition: must die of SIGSEGV.
     block    - worker threads block every signal (sigfillset) and keep writing shared memory.
     churn    - threads malloc/free large blocks (glibc mmaps/munmaps them internally) and
                mmap/munmap/mprotect explicitly while writing them.
     forkexec - threads share memory, the main thread forks; the child writes the shared pages
                and execs `/bin/true`; the parent waits: must exit 0.
   Every mode runs for argv[2] ms (default 800). Exit 0 and "ok" on success. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long run_ms = 800;
static volatile uint64_t *shared;
static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }

static void *sharer(void *arg) {
    long id = (long)arg;
    if (arg == (void *)100 || arg == (void *)101) { /* block mode */
        sigset_t all; sigfillset(&all); pthread_sigmask(SIG_BLOCK, &all, NULL); id -= 100;
    }
    double end = now_ms() + run_ms; uint64_t x = 0;
    while (now_ms() < end) for (int i = (int)id; i < 16384; i += 2) shared[i] += ++x;
    return NULL;
}

static void share_for_a_while(int block) {
    shared = mmap(NULL, 16384 * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, sharer, (void *)(i + (block ? 100 : 0)));
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
}

/* handler mode */
static char *region; static size_t region_len = 256 * 4096; static volatile long faults;
static void on_demand(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)uc;
    char *a = (char *)si->si_addr;
    if (a < region || a >= region + region_len) { signal(SIGSEGV, SIG_DFL); return; }
    uintptr_t page = (uintptr_t)a & ~(uintptr_t)4095;
    if (mprotect((void *)page, 4096, PROT_READ | PROT_WRITE) != 0) _exit(7);
    __sync_fetch_and_add(&faults, 1);
}
static void *toucher(void *arg) {
    long id = (long)arg;
    for (size_t p = (size_t)id; p < 256; p += 2) {
        region[p * 4096 + 8] = 1;
        for (int k = 0; k < 2000; k++) shared[(p * 7 + k) % 16384] += 1; /* keep sampling busy */
    }
    return NULL;
}

static void *churner(void *arg) {
    (void)arg; double end = now_ms() + run_ms;
    while (now_ms() < end) {
        char *b = malloc(512 * 1024); memset(b, 1, 512 * 1024); free(b);
        char *m = mmap(NULL, 64 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        memset(m, 2, 64 * 4096);
        mprotect(m, 4096, PROT_NONE); mprotect(m, 4096, PROT_READ | PROT_WRITE); m[0] = 3;
        munmap(m, 64 * 4096);
        for (int i = 0; i < 16384; i += 3) shared[i]++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "segv";
    if (argc > 2) run_ms = atol(argv[2]);
    if (!strcmp(mode, "segv")) {
        share_for_a_while(0);
        char *ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        ro[0] = 1; /* dies here */
        printf("not reached\n"); return 0;
    }
    if (!strcmp(mode, "sigsegv-user")) { share_for_a_while(0); raise(SIGSEGV); printf("not reached\n"); return 0; }
    if (!strcmp(mode, "block")) { share_for_a_while(1); printf("ok\n"); return 0; }
    if (!strcmp(mode, "handler")) {
        shared = mmap(NULL, 16384 * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        region = mmap(NULL, region_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        struct sigaction sa; memset(&sa, 0, sizeof sa); sa.sa_sigaction = on_demand; sa.sa_flags = SA_SIGINFO;
        sigaction(SIGSEGV, &sa, NULL);
        struct sigaction back; sigaction(SIGSEGV, NULL, &back);
        if (back.sa_sigaction != on_demand) { printf("sigaction did not return our handler\n"); return 5; }
        double end = now_ms() + run_ms;
        while (now_ms() < end) {
            mprotect(region, region_len, PROT_NONE); faults = 0;
            pthread_t t[2];
            for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, toucher, (void *)i);
            for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
            if (faults != 256) { printf("handler saw %ld faults, expected 256\n", faults); return 6; }
        }
        printf("ok\n"); return 0;
    }
    if (!strcmp(mode, "churn")) {
        shared = mmap(NULL, 16384 * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        pthread_t t[2];
        for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, churner, NULL);
        for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
        printf("ok\n"); return 0;
    }
    if (!strcmp(mode, "forkexec")) {
        shared = mmap(NULL, 16384 * 8, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        pthread_t t[2];
        for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, sharer, (void *)i);
        for (int round = 0; round < 5; round++) {
            usleep(run_ms * 1000 / 10);
            pid_t c = fork();
            if (c == 0) {
                for (int i = 0; i < 16384; i++) shared[i] += 1;
                execl("/bin/true", "true", (char *)NULL);
                _exit(9);
            }
            int st = 0; waitpid(c, &st, 0);
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { printf("child failed: %d\n", st); return 8; }
        }
        for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
        printf("ok\n"); return 0;
    }
    fprintf(stderr, "unknown mode %s\n", mode); return 2;
}
