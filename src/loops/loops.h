/* SPDX-License-Identifier: MIT */
/*
 * The relay process: worker threads (lease, publish, mark), the sweeper,
 * the cleaner and, with OUTBOX_LISTEN=on, the listener, each on its own
 * thread with its own Postgres session.
 *
 * Sharing: struct relay is created by main and outlives every thread. Each
 * field below says how it is shared: read-only after relay_init() or
 * relay_start(), a C11 atomic read and written without locks, or under
 * `lock`. Whatever a thread keeps beyond that (its store session, its
 * publisher, its batch) is its own and never shared.
 */
#ifndef OUTBOX_RELAY_H
#define OUTBOX_RELAY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config/config.h"
#include "publishers/publisher.h"

#define RELAY_MAX_THREADS 72
#define RELAY_MAX_PAUSES 256

/* One loop thread, as /healthz sees it. */
/* Every field but last_tick_ms is set by relay_start() before the thread
 * runs; tid and started are then used only by the thread that called
 * relay_start() (relay_finished, relay_join). */
struct worker_share;

struct relay_thread {
	char name[32];
	pthread_t tid;
	bool started;
	atomic_llong last_tick_ms; /* clock_ms() of its last loop pass: written
				      by the thread, read by relay_healthy */
	int64_t max_interval_ms;   /* healthy while ticks are this close */
	struct relay *relay;
	int index;		    /* worker number */
	struct worker_share *share; /* a worker's lanes: what they share */
};

/* A destination (or destination + chr(31) + routing key) refusing events.
 * Lives in relay.pauses: only touched with relay.lock held. */
struct relay_pause {
	char key[300];
	int64_t until_ms;   /* clock_ms() */
	int64_t backoff_ms; /* doubles each time it refuses again */
};

struct relay {
	/* Read-only after relay_init(). */
	const struct config *cfg;
	/* The backend's ops; each worker opens its own state through a
	 * struct publisher (publishers/publisher.h). */
	const struct publisher_ops *pub_ops; /* each worker opens its own */
	char host[64];
	char version[32];
	int pid;

	/* Atomics, read and written without locks. */
	atomic_int stopping;	  /* 1 once shutdown began */
	atomic_int marks_failed;  /* 1 if a mark could not be written */
	atomic_int workers_ready; /* workers with a healthy publisher */

	/* lock guards every field from wake_gen to rate_next_ms; wake is
	 * signalled under it by relay_wake(). */
	pthread_mutex_t lock;
	pthread_cond_t wake; /* on CLOCK_MONOTONIC */
	uint64_t wake_gen;   /* bumped by relay_wake() */
	struct relay_pause pauses[RELAY_MAX_PAUSES];
	size_t n_pauses;
	double rate_next_ms; /* max-rate schedule (clock_ms units) */

	/* Filled by relay_start() before each thread starts; see struct
	 * relay_thread for what is shared after that. */
	struct relay_thread threads[RELAY_MAX_THREADS];
	int n_threads;
	/* One per worker, for its lanes (lanes.c); created by
	 * relay_start(), freed by relay_join() after the threads. */
	struct worker_share *worker_shares;
	/* Written by relay_stop(), on the thread that runs the relay. */
	int64_t shutdown_started_ms;
};

/* Prepares r (no threads yet). Returns 0, or -1 with err. */
int relay_init(struct relay *r, const struct config *cfg,
	       const struct publisher_ops *pub_ops, char *err, size_t errlen);

/* Starts workers, sweeper, cleaner and, if enabled, the listener. Call
 * with signals blocked so the threads inherit the mask. Returns 0, or -1
 * with err. */
int relay_start(struct relay *r, char *err, size_t errlen);

/* Begins the shutdown of docs/design.md §7; returns at once. */
void relay_stop(struct relay *r);

/* Wakes idle workers (new rows, shutdown, resume). */
void relay_wake(struct relay *r);

/* True once every thread returned. */
bool relay_finished(struct relay *r);

/* Joins every thread and frees r's resources. Returns the exit code:
 * 0, or 1 when some mark could not be written. */
int relay_join(struct relay *r);

/* Sleeps up to ms, returning early on relay_wake() or shutdown; keeps the
 * thread's health tick fresh and calls service (if not NULL) every
 * second so broker connections keep their heartbeats. */
void relay_idle(struct relay_thread *th, int64_t ms, void (*service)(void *),
		void *state);

/* Writes the name of the first loop thread that has not ticked within its
 * interval into out and returns false; true when all are healthy. */
bool relay_healthy(struct relay *r, char *out, size_t outlen);

#endif
