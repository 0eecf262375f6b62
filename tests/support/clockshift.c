/* LD_PRELOAD shim for a private redis-server: shifts its wall clock
 * (CLOCK_REALTIME, gettimeofday, time) by the number of microseconds written
 * in the file $TENURE_CLOCK_OFFSET_FILE, re-read on every call, so a test can
 * step the server's clock back or forward without touching the machine's.
 * The monotonic clock is left alone. libfaketime would do this, but it cannot
 * start inside redis-server: jemalloc reads the clock while libfaketime is
 * still initialising (wolfcw/libfaketime#130). Raw syscalls only: no dlsym,
 * no malloc. Built by tests/support/redis_server.py. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_us(void) {
    const char *path = getenv("TENURE_CLOCK_OFFSET_FILE");
    char buf[32];
    if (!path) return 0;
    int fd = (int)syscall(SYS_open, path, O_RDONLY);
    if (fd < 0) return 0;
    long n = (long)syscall(SYS_read, fd, buf, sizeof buf - 1);
    syscall(SYS_close, fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    return strtoll(buf, NULL, 10);
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = (int)syscall(SYS_clock_gettime, id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_us() * 1000LL;
        ts->tv_sec = ns / 1000000000LL;
        ts->tv_nsec = ns % 1000000000LL;
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
