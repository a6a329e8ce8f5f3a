/* Taking a fake library's locks across fork, so that a child forked while another thread is
 * inside a fake call does not find that call's lock held for ever (the thread holding it does
 * not exist in the child).
 *
 * A library's pthread_atfork prepare handler walks its locks in their nesting order (outermost
 * first) through fg_fork_take; the parent and child handlers walk the same locks through
 * fg_fork_release_parent / fg_fork_release_child. The forking thread may itself hold some of
 * them: a program that forks from a signal handler that interrupted a fake call. Such a lock
 * ("self") is left as it is in parent and child (the interrupted call releases it), and every
 * later lock is only tried, not waited for: another thread holding one may be waiting for a
 * lock the forking thread holds. A lock still held after a second of tries ("busy") is
 * treated the same way: left to its holder in the parent and, held by another thread, made
 * anew in the child, with one warning line there (its data may be half changed). A fork from a
 * host callback (cuLaunchHostFunc) holds no fake lock: callbacks run with none held.
 *
 * Which thread holds a mutex is glibc's __data.__owner (the holder's thread id, set by lock and
 * trylock of every mutex type, cleared by unlock); without glibc no lock is seen as the forking
 * thread's, and each is only tried. */
#ifndef FAKEGPU_FORK_H
#define FAKEGPU_FORK_H

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Deeper than any nesting of one library's locks: a thread holds at most this many at once. */
#define FG_FORK_SELF_MAX 32

struct fg_fork_state {
    pid_t forker;    /* the forking thread's id in the parent */
    bool degraded;   /* a lock the forking thread already held was met: later ones only tried */
    int self_count;  /* locks the forking thread held before fork */
    pthread_mutex_t *self[FG_FORK_SELF_MAX];
    int busy;        /* locks another thread held that were not waited for (degraded) */
};

static inline pid_t fg_fork_owner(pthread_mutex_t *m)
{
#ifdef __GLIBC__
    return __atomic_load_n(&m->__data.__owner, __ATOMIC_RELAXED);
#else
    (void)m;
    return 0;
#endif
}

static inline bool fg_fork_is_self(const struct fg_fork_state *s, pthread_mutex_t *m)
{
    for (int i = 0; i < s->self_count; i++)
        if (s->self[i] == m)
            return true;
    return false;
}

/* Starts a prepare walk. */
static inline void fg_fork_begin(struct fg_fork_state *s)
{
    memset(s, 0, sizeof *s);
    s->forker = (pid_t)syscall(SYS_gettid);
}

/* How long a lock another thread holds is tried before it is left busy. */
#define FG_FORK_TRY_NS 1000000000ll

/* Nanoseconds on the monotonic clock (clock_gettime is async-signal-safe: a fork from a signal
 * handler may run this). */
static inline long long fg_fork_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

/* Takes M in the prepare walk; true when the forking thread now holds it (taken, or held
 * already). M is tried, not waited on: glibc sets a mutex's owner a few instructions after
 * taking it (and clears it a few before giving it back), so a signal landing there shows a lock
 * the forking thread holds as nobody's. Tried for a second by the clock (holders keep these
 * locks for one fake call; a count of tries is no bound: on a loaded machine each short sleep
 * lasts several times what it asks, and 20000 tries took 4 s), then left busy and the walk goes
 * on as after a self-held lock. */
static inline bool fg_fork_take(struct fg_fork_state *s, pthread_mutex_t *m)
{
    long long deadline = 0;
    for (int tries = 0;; tries++) {
        if (fg_fork_owner(m) == s->forker) {
            if (s->self_count < FG_FORK_SELF_MAX)
                s->self[s->self_count++] = m;
            s->degraded = true;
            return true;
        }
        if (pthread_mutex_trylock(m) == 0)
            return true;
        if (s->degraded)
            break;
        long long now = fg_fork_now_ns();
        if (!deadline)
            deadline = now + FG_FORK_TRY_NS;
        else if (now >= deadline)
            break;
        if (tries < 100) {
            sched_yield();
        } else {
            struct timespec pause = {0, 50000};
            nanosleep(&pause, NULL);
        }
    }
    s->busy++;
    s->degraded = true;
    return false;
}

/* Whether the forking thread holds M now (between prepare and release). */
static inline bool fg_fork_held(const struct fg_fork_state *s, pthread_mutex_t *m)
{
    return fg_fork_owner(m) == s->forker || fg_fork_is_self(s, m);
}

/* The parent's walk: releases what the prepare walk took. */
static inline void fg_fork_release_parent(const struct fg_fork_state *s, pthread_mutex_t *m)
{
    if (!fg_fork_is_self(s, m) && fg_fork_owner(m) == s->forker)
        pthread_mutex_unlock(m);
}

/* The child's walk (one thread, the forking one, with a new id): releases what the prepare walk
 * took, makes anew what a thread that is gone held. */
static inline void fg_fork_release_child(const struct fg_fork_state *s, pthread_mutex_t *m)
{
    if (fg_fork_is_self(s, m))
        return;
    pid_t owner = fg_fork_owner(m);
    if (owner == s->forker)
        pthread_mutex_unlock(m);
    else if (owner != 0)
        pthread_mutex_init(m, NULL);
}

/* The child's one warning line when it made locks anew (write(2): no stdio lock in a child). */
static inline void fg_fork_warn_child(const struct fg_fork_state *s, const char *library)
{
    if (!s->busy)
        return;
    static const char head[] = "vramshim fakegpu: ";
    static const char tail[] =
        ": forked while a fake lock was busy (another thread held it past a second, or the fork "
        "came from a signal handler inside a fake call): made anew in the child, whose fake GPU "
        "state may be inconsistent\n";
    char line[512];
    size_t n = 0, len = strlen(library);
    if (len > 128)
        len = 128;
    memcpy(line + n, head, sizeof head - 1);
    n += sizeof head - 1;
    memcpy(line + n, library, len);
    n += len;
    memcpy(line + n, tail, sizeof tail - 1);
    n += sizeof tail - 1;
    ssize_t ignored = write(2, line, n);
    (void)ignored;
}

#endif
