/* SPDX-License-Identifier: MIT */
/*
 * The relay process: worker threads (lease, publish, mark), the sweeper,
 * the cleaner and, with OUTBOX_LISTEN=on, the listener, each on its own
 * thread with its own Postgres session. A worker runs as
 * OUTBOX_WORKER_WINDOW lanes (docs/design.md §7, "The worker's window"):
 * threads that each lease, publish and mark one batch at a time and share
 * the worker's one publisher, used by one lane at a time.
 *
 * struct relay is opaque: main creates it, starts it, stops it and joins
 * it from one thread; the accessors below may be called from any thread
 * while it lives (between relay_create() and relay_destroy()).
 */
#ifndef OUTBOX_LOOPS_H
#define OUTBOX_LOOPS_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "publishers/publisher.h"

struct relay;

/* Prepares a relay for cfg and the backend pub_ops (no threads yet); both
 * must outlive it. Returns 0 with *out set, or -1 with err. */
int relay_create(struct relay **out, const struct config *cfg,
		 const struct publisher_ops *pub_ops, char *err, size_t errlen);

/* Starts workers, sweeper, cleaner and, if enabled, the listener. Call
 * with signals blocked so the threads inherit the mask. Returns 0, or -1
 * with err (call relay_join() then too: some threads may run). */
int relay_start(struct relay *r, char *err, size_t errlen);

/* Begins the shutdown of docs/design.md §7; returns at once. */
void relay_stop(struct relay *r);

/* True once relay_stop() was called. */
bool relay_stopping(const struct relay *r);

/* Wakes idle workers (new rows, shutdown, resume). */
void relay_wake(struct relay *r);

/* True once every thread returned. */
bool relay_finished(struct relay *r);

/* Joins every thread. Returns the exit code: 0, or 1 when some mark could
 * not be written at shutdown. */
int relay_join(struct relay *r);

/* Frees r (after relay_join()); r may be NULL. */
void relay_destroy(struct relay *r);

/* Writes the name of the first loop thread that has not ticked within its
 * interval into out and returns false; true when all are healthy. */
bool relay_healthy(struct relay *r, char *out, size_t outlen);

/* True while at least one worker has a healthy publisher. */
bool relay_publisher_ready(const struct relay *r);

/* The backend's name (OUTBOX_PUBLISHER). */
const char *relay_publisher_name(const struct relay *r);

/* The settings the relay runs with. */
const struct config *relay_config(const struct relay *r);

/* The replica's id, host/pid, as the replica registry and claims name it. */
void relay_replica_id(const struct relay *r, char *out, size_t outlen);

/* The host name the relay's sessions and registry row carry. */
const char *relay_host(const struct relay *r);

/* How many sources there are now (docs/design.md §13); each index below
 * stays for the relay's life. Any thread. */
size_t relay_sources_n(struct relay *r);
/* Source i's name (i below relay_sources_n()): its table, "name" or
 * "schema.name", and with several databases "database/table". */
const char *relay_source_name(struct relay *r, size_t i);
/* Source i's table, and the index of its database (config.h). */
const char *relay_source_table(struct relay *r, size_t i);
size_t relay_source_db(struct relay *r, size_t i);
/* Whether source i's table was found gone (a pattern's, let go). */
bool relay_source_gone(struct relay *r, size_t i);
/* How many times source i's table came back from gone or was found made
 * anew (docs/design.md §13): a store of it opened under another epoch is
 * of a table dropped since. */
unsigned relay_source_epoch(struct relay *r, size_t i);

/* What /metrics shows of source i: its events by outcome since start,
 * whether a loop thread has it set aside, whether it is gone, the age
 * of the oldest event of its last leased batch (0: that lease was empty),
 * and its table's dead tuples as last noted (-1: never read). */
struct relay_source_stats {
	uint64_t sent, retried, failed;
	bool failing, gone;
	int64_t lag_ms;
	int64_t dead_tuples;
};
void relay_source_stats(struct relay *r, size_t i,
			struct relay_source_stats *out);

/* Notes source i's table's dead tuples (-1: unknown, a table gone), as
 * the ops thread reads them at each gauge refresh. */
void relay_note_dead_tuples(struct relay *r, size_t i, int64_t n);

/* Notes the notification queue's usage (parts per million) of database
 * db, as a listener or the ops session read it; outbox_notify_queue_
 * usage_ratio shows the highest of the databases', which several writers
 * of one gauge had made flip between servers. */
void relay_note_notify_usage(struct relay *r, size_t db, int64_t ppm);

#endif
