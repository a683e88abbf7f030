/* SPDX-License-Identifier: MIT */
/*
 * The publisher interface: one const struct publisher_ops per backend
 * (publishers/<name>.c), collected in publisher_registry[] (registry.c).
 *
 * Threading: the OUTBOX_WORKER_WINDOW lanes of one worker share one
 * publisher (struct lanes, src/loops/lanes.c). A publisher state is opened
 * by its worker and used by one lane at a time, under the lanes' publisher
 * lock: successive calls on one state may come from different threads
 * (whichever lane holds the lock), never two at once, so a backend keeps
 * nothing in thread-local storage and needs no lock of its own around its
 * state. The publish_ctx callbacks run on the thread that called
 * publish(). Backends share nothing mutable between states (the stdout
 * backend's FILE aside, which stdio locks per call). Threads of a
 * backend's own (AMQP's watchdog) or of its library (librdkafka's) are
 * described by that backend. publisher_ops themselves are immutable.
 *
 * Outcome classes follow docs/design.md §3. Every call of
 * publish() fills one pub_result per event; no event is reported
 * PUB_ACKED before the broker acknowledged it.
 */
#ifndef OUTBOX_PUBLISHER_H
#define OUTBOX_PUBLISHER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config/config.h"
#include "base/base.h"

enum pub_outcome {
	/* The broker acknowledged the event: mark sent. */
	PUB_ACKED = 0,
	/* Never handed to the broker, or refused before anything could have
	 * been written: released, its attempt given back. */
	PUB_NOT_WRITTEN,
	/* Handed over, outcome unknown (connection lost, no confirm within
	 * the deadline): the broker's fault. Retried with backoff keeping
	 * the charge, never failed for it; the publisher goes unhealthy. */
	PUB_TRANSPORT,
	/* The destination refused (unknown topic, missing exchange,
	 * unroutable, not authorized): that destination is paused and the
	 * row released. The broker wrote nothing for it. */
	PUB_DESTINATION,
	/* The broker rejected this message (nack): retried with backoff
	 * until attempts are spent. */
	PUB_EVENT,
	/* The row itself can never succeed (too large, invalid header,
	 * cannot encode): failed at once. */
	PUB_PERMANENT,
};

struct pub_result {
	enum pub_outcome outcome;
	/* PUB_DESTINATION only: true when just this routing key of the
	 * destination is refused (AMQP unroutable), false when the whole
	 * destination (exchange or topic) is. */
	bool route_scoped;
	/* Why, for last_error and logs; "" for PUB_ACKED. Never a secret. */
	char reason[256];
};

/*
 * What the relay lends a publish() call. The callbacks run on the thread
 * that called publish() (the lane holding the publisher lock), only from
 * inside that call.
 */
struct publish_ctx {
	/* Monotonic ms (clock_ms()): stop waiting for outcomes at this time
	 * and report what is still open as PUB_TRANSPORT. */
	int64_t deadline_ms;
	/* Ask before handing event i to the broker; false means do not
	 * (the batch's local lease deadline has passed, or shutdown has
	 * begun), and the event is PUB_NOT_WRITTEN. A renewal never takes a
	 * row from the batch: it only keeps the lease's transaction alive. */
	bool (*may_send)(struct publish_ctx *ctx, size_t i);
	/* Call at least every 200 ms while waiting for outcomes; it renews
	 * the batch's lease (keeps its transaction alive) when due. Returns
	 * true once shutdown has begun: purge what is queued but unsent
	 * (PUB_NOT_WRITTEN) and keep waiting for what was sent until
	 * deadline_ms. */
	bool (*tick)(struct publish_ctx *ctx);
	void *opaque; /* the relay's */
};

struct publisher_ops {
	const char *name;
	/* The backend's own settings (config_load() reads every backend's,
	 * whichever is chosen), or NULL when it has none. */
	const struct config_group *settings;
	/* Where rows with a NULL exchange go under cfg ("" when the
	 * backend has no such notion). */
	const char *(*default_destination)(const struct config *cfg);
	/* Startup check of the backend's settings; 0 or -1 with err set. */
	int (*validate)(const struct config *cfg, char *err, size_t errlen);
	/* Logs one warning per link of the backend that crosses the
	 * network in plaintext or with TLS verification off (run and check
	 * call it once, after validate). May be NULL. */
	void (*warn_links)(const struct config *cfg);
	/* Connects; 0 with *state set, or -1 with err set (naming host, never
	 * a secret). A failed open is retried by the caller with backoff. */
	int (*open)(const struct config *cfg, void **state, char *err,
		    size_t errlen);
	/* Publishes n events pipelined, then awaits every outcome. Fills
	 * results[0..n-1]. Returns 0, or -1 when the publisher is unusable
	 * afterwards (the caller probes before the next batch). */
	int (*publish)(void *state, const struct outbox_event *events, size_t n,
		       struct publish_ctx *ctx, struct pub_result *results);
	/* A real end-to-end check (reconnecting if needed); 0 healthy, or -1
	 * with err set. */
	int (*probe)(void *state, char *err, size_t errlen);
	/* Lets the backend service its connection (heartbeats, delivery
	 * reports) while a lane sleeps or waits for its turn or the
	 * publisher, about once a second; called under the publisher lock
	 * like every other call on the state. May be NULL. */
	void (*service)(void *state);
	void (*close)(void *state);
};

/* NULL-terminated. */
extern const struct publisher_ops *const publisher_registry[];

/* The backend called name, or NULL. */
const struct publisher_ops *publisher_find(const char *name);

/* The destination rows with a NULL exchange go to under cfg: the chosen
 * backend's default_destination ("" for an unknown backend). */
const char *publisher_default_destination(const struct config *cfg);

/*
 * What config_load() and the settings printers need from the backends:
 * every backend's settings group and the check of OUTBOX_PUBLISHER.
 * Fills *ext; its groups array is static and lives for the process.
 */
void publisher_config_extensions(struct config_extensions *ext);

/*
 * A publisher as its user holds it: the backend's ops and the one state
 * it opened. Callers reach the backend only through the wrappers below,
 * so the open flag always says whether state may be used.
 *
 * Ownership: the handle belongs to the lanes of one worker, which use it
 * one at a time under their publisher lock (see Threading above); the
 * handle owns state between a successful publisher_open() and
 * publisher_close(). healthy is the lanes' verdict: the wrappers never
 * change it.
 */
struct publisher {
	const struct publisher_ops *ops;
	void *state; /* the backend's; valid only while open */
	bool open;
	bool healthy;
};

/* The backend's startup check of its settings; 0, or -1 with err set. */
static inline int publisher_validate(const struct publisher_ops *ops,
				     const struct config *cfg, char *err,
				     size_t errlen)
{
	return ops->validate ? ops->validate(cfg, err, errlen) : 0;
}

/* The backend's startup warnings about its links, if it has any. */
static inline void publisher_warn_links(const struct publisher_ops *ops,
					const struct config *cfg)
{
	if (ops->warn_links)
		ops->warn_links(cfg);
}

static inline void publisher_init(struct publisher *pub,
				  const struct publisher_ops *ops)
{
	*pub = (struct publisher){.ops = ops};
}

/* Connects; 0, or -1 with err set (see publisher_ops.open). */
static inline int publisher_open(struct publisher *pub,
				 const struct config *cfg, char *err,
				 size_t errlen)
{
	int rc = pub->ops->open(cfg, &pub->state, err, errlen);
	pub->open = rc == 0;
	return rc;
}

static inline int publisher_publish(struct publisher *pub,
				    const struct outbox_event *events, size_t n,
				    struct publish_ctx *ctx,
				    struct pub_result *results)
{
	return pub->ops->publish(pub->state, events, n, ctx, results);
}

static inline int publisher_probe(struct publisher *pub, char *err,
				  size_t errlen)
{
	return pub->ops->probe(pub->state, err, errlen);
}

/* Does nothing unless open and the backend has a service call. */
static inline void publisher_service(struct publisher *pub)
{
	if (pub->open && pub->ops->service)
		pub->ops->service(pub->state);
}

/* Does nothing unless open. */
static inline void publisher_close(struct publisher *pub)
{
	if (!pub->open)
		return;
	pub->ops->close(pub->state);
	pub->state = NULL;
	pub->open = false;
}

#endif
