/* The step tracer's test server: one thread that waits for a byte on stdin (a blocking read),
 * raises SIGUSR1 (its handler sets a flag), answers with whether the handler ran ('Y' or 'N')
 * on stdout, then parks on a condition variable (a futex wait) for ever — as a pool thread
 * handed a request parks after answering it. It writes 'r' when it is about to wait. */
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

static volatile sig_atomic_t got;

static void on_usr1(int s) {
    (void)s;
    got = 1;
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, 0);
    if (write(1, "r", 1) != 1) return 1;
    char c;
    if (read(0, &c, 1) != 1) return 1;
    raise(SIGUSR1);
    char out = got ? 'Y' : 'N';
    if (write(1, &out, 1) != 1) return 1;
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    pthread_mutex_lock(&m);
    for (;;) pthread_cond_wait(&cv, &m);
}
