/* SPDX-License-Identifier: MIT */
/*
 * Linked into every program of a ThreadSanitizer build (meson.build, only
 * when b_sanitize=thread; tests/tsan/run.sh): glibc calls that gcc 12's
 * TSan runtime (and clang 14's) does not intercept, done here on top of
 * what it does see. Defined in the executable, they take precedence over
 * glibc's for the program and for the libraries it loads. Without them
 * TSan is blind to a thread or a lock and reports what is not there;
 * with them it checks the same code, not different code.
 *
 * C11 threads: librdkafka starts its threads with thrd_create(), which
 * glibc (2.34 on) implements with an internal call to pthread_create, so
 * a librdkafka thread ran without the runtime's per-thread state and its
 * first malloc crashed. thrd_join comes along so the runtime sees the end
 * of the threads it saw begin (else it reports them leaked). librdkafka's
 * C11 mutexes stay out of its sight: its own accesses are not
 * instrumented, and tests/tsan/suppressions.txt covers what it frees.
 *
 * pthread_mutex_clocklock (src/loops/lanes.c): glibc's own, announced to
 * the runtime as a timed lock, as its pthread_mutex_timedlock interceptor
 * does; otherwise the lock is unseen and the unlock that follows is
 * reported as the unlock of an unlocked mutex.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>
#include <time.h>

#include <sanitizer/tsan_interface.h>

struct c11_start {
	thrd_start_t func;
	void *arg;
};

/* The C11 result travels as glibc's thrd_join expects it: an int in the
 * pthread result pointer. */
static void *c11_trampoline(void *p)
{
	struct c11_start start = *(struct c11_start *)p;
	free(p);
	return (void *)(intptr_t)start.func(start.arg);
}

static int c11_result(int err)
{
	switch (err) {
	case 0:
		return thrd_success;
	case ENOMEM:
		return thrd_nomem;
	case EBUSY:
		return thrd_busy;
	default:
		return thrd_error;
	}
}

int thrd_create(thrd_t *thr, thrd_start_t func, void *arg)
{
	struct c11_start *start = malloc(sizeof(*start));
	if (!start)
		return thrd_nomem;
	start->func = func;
	start->arg = arg;
	/* thrd_t is glibc's pthread_t; like glibc, the id is stored before
	 * the thread starts, which may read it. */
	int err = pthread_create(thr, NULL, c11_trampoline, start);
	if (err != 0)
		free(start);
	return c11_result(err);
}

int thrd_join(thrd_t thr, int *res)
{
	void *value = NULL;
	int err = pthread_join(thr, &value);
	if (err == 0 && res)
		*res = (int)(intptr_t)value;
	return c11_result(err);
}

typedef int (*clocklock_fn)(pthread_mutex_t *, clockid_t,
			    const struct timespec *);

int pthread_mutex_clocklock(pthread_mutex_t *mutex, clockid_t clock,
			    const struct timespec *abstime)
{
	static _Atomic(clocklock_fn) real;
	clocklock_fn fn = real;
	if (!fn) {
		fn = (clocklock_fn)dlsym(RTLD_NEXT, "pthread_mutex_clocklock");
		if (!fn)
			return EINVAL; /* no glibc below: nothing to lock with
					*/
		real = fn;
	}
	__tsan_mutex_pre_lock(mutex, __tsan_mutex_try_lock);
	int rc = fn(mutex, clock, abstime);
	__tsan_mutex_post_lock(
	    mutex,
	    __tsan_mutex_try_lock | (rc ? __tsan_mutex_try_lock_failed : 0), 0);
	return rc;
}
