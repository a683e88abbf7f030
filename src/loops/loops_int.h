/* SPDX-License-Identifier: MIT */
/*
 * What the loop threads share inside src/loops: the thread entry points,
 * the sleeps and reconnects every loop uses, and the two pieces of shared
 * state the workers coordinate through (destination pauses and the max-rate
 * schedule, both under relay.lock). Private to this folder; loops/loops.h
 * is the public surface.
 */
#ifndef OUTBOX_LOOPS_INT_H
#define OUTBOX_LOOPS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loops.h"
#include "store/store.h"

#define RECONNECT_MIN_MS 100
#define RECONNECT_MAX_MS 5000

/* The length of a destination pause key (see struct relay_pause). */
#define PAUSE_KEY_MAX 300

/* Thread entry points; arg is the thread's struct relay_thread. */
void *worker_main(void *arg);
void *sweeper_main(void *arg);
void *cleaner_main(void *arg);
void *listener_main(void *arg);

/* ---- relay.c: what every loop thread uses ---- */

/* Records a loop pass for relay_healthy(). */
void loop_tick(struct relay_thread *th);

bool relay_stopping(const struct relay *r);

/* The current wake-up generation, for relay_idle_since(). */
uint64_t relay_wake_generation(struct relay *r);

/* Sleeps like relay_idle(), but returns at once when a wake-up came after
 * generation *gen was read. gen NULL: only shutdown ends the sleep early. */
void relay_idle_since(struct relay_thread *th, const uint64_t *gen, int64_t ms,
		      void (*service)(void *), void *state);

/* Writes the application_name of thread `who` into out. */
void relay_app_name(const struct relay *r, const char *who, char *out,
		    size_t outlen);

/* Reconnects s with capped exponential backoff. Returns 0, or -1 when
 * shutdown began first. */
int relay_reconnect(struct relay_thread *th, struct store *s);

/* Opens the thread's store, retrying until it works; NULL only when
 * shutdown began first. */
struct store *relay_open_store(struct relay_thread *th, const char *who);

/* ---- pauses.c: destinations that refused events (under r->lock) ---- */

/* Pauses destination key (doubling its pause if it is refused again after
 * the last one ended); reason goes to the log. */
void pause_destination(struct relay *r, const char *key, const char *reason);

/* Copies up to max active pause keys into keys[] and returns how many;
 * forgets pauses long expired. */
size_t active_pauses(struct relay *r, char (*keys)[PAUSE_KEY_MAX], size_t max);

/* ---- rate.c: the per-replica max rate (under r->lock) ---- */

/* Reserves n events of the rate; returns the ms to wait before using
 * them (0 without a max rate). */
int64_t rate_reserve(struct relay *r, double n);

/* Gives back n reserved events that were not used. */
void rate_refund(struct relay *r, double n);

#endif
