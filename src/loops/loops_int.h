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

/* ---- lanes.c: what the lanes of one worker share ---- */

/* n workers' shares, each for `lanes` lane threads; NULL with err. */
struct worker_share *worker_shares_create(struct relay *r, int n, int lanes,
					  char *err, size_t errlen);
/* Worker i's share. */
struct worker_share *worker_share_at(struct worker_share *shares, int i);
/* After every lane thread returned. */
void worker_shares_destroy(struct worker_share *shares, int n);

/* Opens or probes the worker's publisher when due and services it; true
 * when healthy, else *next_probe_ms says when to ask again. */
bool lanes_publisher_ready(struct worker_share *s, const struct config *cfg,
			   int64_t *next_probe_ms);
/* Keeps an idle publisher's connection serviced (heartbeats); a relay_idle
 * service callback taking the share. */
void lanes_publisher_service(void *share);
/* Publishes on the worker's publisher when ticket's turn comes (batches go
 * out in lease order); ctx->tick runs while waiting. An unhealthy
 * publisher hands nothing over (PUB_NOT_WRITTEN). Returns what
 * publisher_publish() did, -1 when it was not called. */
int lanes_publish(struct worker_share *s, uint64_t ticket,
		  const struct outbox_event *events, size_t n,
		  struct publish_ctx *ctx, struct pub_result *results);
/* Gives up ticket's turn, in its order, for a batch with nothing to
 * publish. Every ticket goes through lanes_publish() or this, once. */
void lanes_pass(struct worker_share *s, uint64_t ticket);
/* docs/design.md §7: closes the publisher before a lane releases never-sent
 * rows at shutdown. */
void lanes_close_before_release(struct worker_share *s);
/* A lane thread ends; the last one closes the publisher. */
void lanes_leave(struct worker_share *s);

/* Waits for this lane's turn to lease (one lane leases at a time, and not
 * before the cadence set by the last lease). False when shutdown began. */
bool lanes_take_turn(struct worker_share *s, struct relay_thread *th);
/* Ends the turn: the next lease not before next_lease_ms, or, when the
 * lease found nothing (idle), also at a wake-up after generation gen.
 * When the lane leased rows, returns the batch's publish ticket (else 0). */
uint64_t lanes_end_turn(struct worker_share *s, int64_t next_lease_ms,
			bool idle, uint64_t gen, bool leased);

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
