/* SPDX-License-Identifier: MIT */
/*
 * Destination pauses: a destination (or destination + chr(31) + routing
 * key) that refused an event is skipped by every worker's lease until its
 * pause ends. Shared by all workers: relay.pauses and relay.n_pauses are
 * touched only with relay.lock held.
 */
#include "loops_int.h"

#include <stdio.h>
#include <string.h>

#include "base/base.h"

#define PAUSE_MIN_MS 1000
#define PAUSE_MAX_MS 60000

/* Call with r->lock held. A full table gives up the slot whose pause
 * ended first (long over, usually; else the one due to end soonest): a
 * refusal that found no slot would leave its rows unpaused, leased again
 * and refused again at once, for as long as the table stayed full. */
static struct relay_pause *find_or_add_pause(struct relay *r, const char *key,
					     int64_t now)
{
	for (size_t i = 0; i < r->n_pauses; i++)
		if (strcmp(r->pauses[i].key, key) == 0)
			return &r->pauses[i];
	struct relay_pause *p;
	if (r->n_pauses < RELAY_MAX_PAUSES) {
		p = &r->pauses[r->n_pauses++];
	} else {
		p = &r->pauses[0];
		for (size_t i = 1; i < r->n_pauses; i++)
			if (r->pauses[i].until_ms < p->until_ms)
				p = &r->pauses[i];
		if (p->until_ms > now)
			log_fields(LOG_WARN,
				   "destination pauses full: the one ending "
				   "soonest ends now",
				   "destination", p->key, NULL);
	}
	snprintf(p->key, sizeof(p->key), "%s", key);
	p->backoff_ms = 0;
	p->until_ms = 0;
	return p;
}

static void log_paused(const char *key, const char *reason)
{
	char shown[PAUSE_KEY_MAX];
	snprintf(shown, sizeof(shown), "%s", key);
	/* The unit separator would be invisible in the log. */
	char *sep = strchr(shown, '\x1f');
	if (sep)
		*sep = ' ';
	log_fields(LOG_WARN, "destination paused", "destination", shown,
		   "reason", reason, NULL);
}

int64_t pause_destination(struct relay *r, const char *key, const char *reason)
{
	int64_t now = clock_ms();
	pthread_mutex_lock(&r->lock);
	struct relay_pause *p = find_or_add_pause(r, key, now);
	/* A refusal during the pause comes from a batch leased before it:
	 * it says nothing new. */
	if (p->until_ms <= now) {
		/* Refused again after its pause: wait longer next time. */
		p->backoff_ms =
		    p->backoff_ms ? p->backoff_ms * 2 : PAUSE_MIN_MS;
		if (p->backoff_ms > PAUSE_MAX_MS)
			p->backoff_ms = PAUSE_MAX_MS;
		p->until_ms = now + p->backoff_ms;
		log_paused(key, reason);
	}
	int64_t until = p->until_ms;
	pthread_mutex_unlock(&r->lock);
	return until;
}

size_t active_pauses(struct relay *r, char (*keys)[PAUSE_KEY_MAX], size_t max)
{
	int64_t now = clock_ms();
	size_t n = 0;
	pthread_mutex_lock(&r->lock);
	for (size_t i = 0; i < r->n_pauses;) {
		struct relay_pause *p = &r->pauses[i];
		if (p->until_ms > now) {
			if (n < max)
				snprintf(keys[n++], PAUSE_KEY_MAX, "%s",
					 p->key);
			i++;
		} else if (now - p->until_ms > 10 * PAUSE_MAX_MS) {
			/* Long expired: its backoff no longer matters, and
			 * the slot may be needed. */
			r->pauses[i] = r->pauses[--r->n_pauses];
		} else {
			i++;
		}
	}
	pthread_mutex_unlock(&r->lock);
	metrics_set(MG_DESTINATIONS_PAUSED, (int64_t)n);
	return n;
}
