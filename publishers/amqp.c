/* SPDX-License-Identifier: MIT */
/*
 * The AMQP 0-9-1 backend (RabbitMQ, librabbitmq 0.11): persistent,
 * mandatory publishes with publisher confirms, pipelined per batch and
 * awaited in a frame loop, since 0.11 has no confirm-wait helper. The
 * message mapping lives in amqp_map.c, the connection in amqp_conn.c and
 * the handling of what the broker sends back in amqp_frames.c; this file
 * writes batches, probes and holds the publisher_ops.
 *
 * One connection and one channel per publisher state, that is per worker,
 * used by one lane at a time under the lanes' publisher lock (publisher.h);
 * librabbitmq keeps no threads, and the state's watchdog (amqp_conn.h)
 * touches only its own fields and the armed socket. Channel numbers move
 * on at every reopen and frames for any other channel are dropped, so a
 * late confirm from a closed channel can never settle a later batch.
 */
#include "amqp_conn.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#include "amqp_map.h"
#include "base/base.h"

/* Writes slot i on the current channel. 0, or -1 when the connection
 * broke (the slot is then in doubt). */
static int write_slot(struct rmq_state *st, size_t i)
{
	struct flight *fl = st->fl;
	struct slot *s = &fl->slots[i];
	char why[200];
	bool fired;
	int rc;

	/* A few ms of grace: the caller checked the deadline just before. */
	rmq_watchdog_arm(st, fl->deadline > clock_ms() + 50 ? fl->deadline
							    : clock_ms() + 50);
	rc = amqp_basic_publish(st->conn, st->channel, s->msg.exchange,
				s->msg.routing_key, fl->mandatory, 0,
				&s->msg.props, s->msg.body);
	fired = rmq_watchdog_disarm(st);
	s->writes++;
	if (rc == AMQP_STATUS_OK && !fired) {
		s->state = SLOT_WRITTEN;
		s->tag = st->next_tag++;
		fl->by_tag[fl->ntags++] = i;
		fl->unsettled++;
		return 0;
	}
	if (fired) {
		rmq_set_reason(why, sizeof(why),
			       "publish stuck past its deadline; connection "
			       "dropped");
	} else {
		char status[160];

		rmq_describe_status(rc, status, sizeof(status));
		rmq_set_reason(
		    why, sizeof(why),
		    "connection to the broker lost while publishing: "
		    "%s",
		    status);
	}
	/* Part of it may be on the wire: in doubt. */
	s->state = SLOT_WRITTEN;
	fl->unsettled++;
	rmq_settle(fl, i, PUB_TRANSPORT, RMQ_SCOPE_DESTINATION, why);
	rmq_conn_drop(st, why);
	return -1;
}

/* Rows with a NULL exchange go to OUTBOX_AMQP_EXCHANGE. */
static const char *rmq_default_destination(const struct config *cfg)
{
	const char *exchange = rmq_settings_of(cfg)->exchange;

	return exchange ? exchange : "";
}

static const char *slot_exchange(const struct config *cfg,
				 const struct outbox_event *ev)
{
	return ev->exchange ? ev->exchange : rmq_default_destination(cfg);
}

/* Ends the flight: what is still open gets its final outcome. Returns
 * what publish() returns. */
static int flight_finish(struct rmq_state *st, const char *unsent_why)
{
	struct flight *fl = st->fl;
	char why[256];
	int rc = 0;

	if (fl->lost) {
		for (size_t i = 0; i < fl->n; i++) {
			if (fl->slots[i].state == SLOT_WRITTEN)
				rmq_settle(fl, i, PUB_TRANSPORT,
					   RMQ_SCOPE_DESTINATION, fl->lost_why);
		}
		rmq_set_reason(why, sizeof(why), "not sent: %s", fl->lost_why);
		unsent_why = why;
		rc = -1;
	} else if (fl->unsettled > 0) {
		char timeout[128];

		rmq_set_reason(timeout, sizeof(timeout),
			       "outcome unknown: no confirm from the broker "
			       "within the publish deadline");
		for (size_t i = 0; i < fl->n; i++)
			if (fl->slots[i].state == SLOT_WRITTEN)
				rmq_settle(fl, i, PUB_TRANSPORT,
					   RMQ_SCOPE_DESTINATION, timeout);
		/* Before any row is marked: a late ack on this channel
		 * must not settle the next batch's tags. */
		rmq_channel_abandon(st);
		if (fl->confirms == 0 || !st->conn)
			rc = -1;
	}
	for (size_t i = 0; i < fl->n; i++)
		if (fl->slots[i].state == SLOT_UNSENT)
			rmq_settle_unsent(fl, i, unsent_why);
	if (st->blocked || !st->conn)
		rc = -1;
	return rc;
}

/* ---- publisher_ops ---- */

static int rmq_validate(const struct config *cfg, char *err, size_t errlen)
{
	const struct rmq_settings *as = rmq_settings_of(cfg);
	char why[200];

	if (!as->url || !*as->url) {
		rmq_set_reason(err, errlen, "OUTBOX_AMQP_URL is not set");
		return -1;
	}
	if (rmq_url_check(as->url, why, sizeof(why)) != 0) {
		rmq_set_reason(err, errlen, "OUTBOX_AMQP_URL: %s", why);
		return -1;
	}
	if (as->declare_exchange && (!as->exchange || !*as->exchange)) {
		rmq_set_reason(
		    err, errlen,
		    "OUTBOX_AMQP_DECLARE_EXCHANGE=on needs a non-empty "
		    "OUTBOX_AMQP_EXCHANGE (the default exchange cannot "
		    "be declared)");
		return -1;
	}
	return rmq_settings_check(as, err, errlen);
}

static void rmq_warn_links(const struct config *cfg)
{
	rmq_settings_warn(rmq_settings_of(cfg));
}

static void state_free(struct rmq_state *st)
{
	if (!st)
		return;
	rmq_conn_close(st);
	rmq_watchdog_stop(&st->wd);
	if (st->url) {
		/* amqp_parse_url() cut the copy with NULs: the password lies
		 * past the first. */
		explicit_bzero(st->url, st->url_len);
		free(st->url);
	}
	free(st);
}

static int rmq_open(const struct config *cfg, void **state, char *err,
		    size_t errlen)
{
	struct rmq_state *st = calloc(1, sizeof(*st));
	char host[128], quoted_vhost[80];

	if (!st) {
		rmq_set_reason(err, errlen, "amqp: out of memory");
		return -1;
	}
	st->cfg = cfg;
	st->channel_max = 1;
	if (rmq_validate(cfg, err, errlen) != 0)
		goto fail;
	st->url = strdup(rmq_settings_of(cfg)->url);
	st->url_len = st->url ? strlen(st->url) : 0;
	if (!st->url) {
		rmq_set_reason(err, errlen, "amqp: out of memory");
		goto fail;
	}
	amqp_default_connection_info(&st->ci);
	amqp_parse_url(st->url, &st->ci);
	cloudevent_quote(quoted_vhost, sizeof(quoted_vhost), st->ci.vhost,
			 strlen(st->ci.vhost), 64);
	rmq_set_reason(st->where, sizeof(st->where), "%s:%d, vhost '%s'",
		       st->ci.host, st->ci.port, quoted_vhost);
	if (gethostname(host, sizeof(host)) != 0)
		rmq_set_reason(host, sizeof(host), "unknown");
	host[sizeof(host) - 1] = '\0';
	rmq_set_reason(st->conn_name, sizeof(st->conn_name),
		       "outbox-relay %s pid %d", host, (int)getpid());
	if (rmq_watchdog_start(&st->wd, err, errlen) != 0)
		goto fail;
	if (rmq_conn_open(st, err, errlen) != 0)
		goto fail;
	*state = st;
	return 0;
fail:
	state_free(st);
	return -1;
}

/* The reason for every event of a batch the blocked broker cannot take. */
static void blocked_reason(const struct rmq_state *st, char *buf, size_t len)
{
	rmq_set_reason(buf, len, "broker blocked the connection: %s",
		       st->blocked_why);
}

/* One publish() call: the flight and where writing it has got to. */
struct batch {
	struct rmq_state *st;
	struct flight *fl;
	struct publish_ctx *ctx;
	const struct outbox_event *events;
	size_t cursor; /* the first slot that may still be unsent */
	unsigned since_pump;
	bool shutdown;
	int64_t last_tick;
	const char *unsent_why; /* for slots never written */
	char why[256];
};

/* Every result starts "not handed to the broker"; the slots learn where
 * their event goes. -1 when out of memory (results say so). */
static int flight_init(struct flight *fl, const struct config *cfg,
		       const struct outbox_event *events)
{
	for (size_t i = 0; i < fl->n; i++) {
		fl->results[i].outcome = PUB_NOT_WRITTEN;
		fl->results[i].route_scoped = false;
		rmq_set_reason(fl->results[i].reason,
			       sizeof(fl->results[i].reason),
			       "not handed to the broker");
	}
	fl->slots = calloc(fl->n, sizeof(*fl->slots));
	fl->by_tag = calloc(fl->n, sizeof(*fl->by_tag));
	if (!fl->slots || !fl->by_tag) {
		for (size_t i = 0; i < fl->n; i++)
			rmq_set_reason(fl->results[i].reason,
				       sizeof(fl->results[i].reason),
				       "amqp: out of memory");
		return -1;
	}
	for (size_t i = 0; i < fl->n; i++) {
		fl->slots[i].id = events[i].id;
		fl->slots[i].exchange = slot_exchange(cfg, &events[i]);
		fl->slots[i].routing_key =
		    events[i].routing_key ? events[i].routing_key : "";
	}
	return 0;
}

/* Learns of a broken connection or a block before writing anything.
 * false with b->unsent_why set when nothing can be written. */
static bool flight_ready(struct batch *b)
{
	struct rmq_state *st = b->st;

	rmq_pump_ready(st);
	if (!st->conn) {
		rmq_set_reason(
		    b->why, sizeof(b->why), "not connected to the broker: %s",
		    b->fl->lost ? b->fl->lost_why : "connection closed");
		b->fl->lost = false; /* nothing was written: nothing in doubt */
		b->unsent_why = b->why;
		return false;
	}
	if (st->blocked) {
		blocked_reason(st, b->why, sizeof(b->why));
		b->unsent_why = b->why;
		return false;
	}
	if (!st->channel_open) {
		/* As mid-batch (slot_send()): an answer too late would cost
		 * the connection. */
		int rc = -1;
		if (b->fl->deadline - clock_ms() < REOPEN_MIN_MS)
			rmq_set_reason(b->why, sizeof(b->why),
				       "not sent: too little time left before "
				       "the publish deadline to open a "
				       "channel");
		else
			rc = rmq_channel_open(st, b->fl->deadline, b->why,
					      sizeof(b->why));
		if (rc != 0) {
			b->fl->lost = false;
			b->unsent_why = b->why;
			return false;
		}
	}
	b->fl->base_tag = b->fl->low_tag = st->next_tag;
	return true;
}

/* Builds slot i's message once and checks it fits a frame; false when the
 * slot got its outcome instead. */
static bool slot_build(struct batch *b, size_t i)
{
	struct flight *fl = b->fl;
	struct slot *s = &fl->slots[i];
	struct pub_result *r = &fl->results[i];

	if (!s->built) {
		if (rmq_msg_build(b->st->cfg, &b->events[i], &s->msg, r->reason,
				  sizeof(r->reason))) {
			/* Only memory can fail a row the relay validated:
			 * retried with backoff, charged, so that a row
			 * that always needs more ends at max_attempts. */
			rmq_settle(fl, i,
				   strcmp(r->reason, CLOUDEVENT_NO_MEMORY) == 0
				       ? PUB_EVENT
				       : PUB_PERMANENT,
				   RMQ_SCOPE_DESTINATION, r->reason);
			return false;
		}
		s->built = true;
	}
	if (rmq_msg_check_fit(&s->msg, b->st->frame_max, b->why,
			      sizeof(b->why)) != 0) {
		rmq_settle(fl, i, PUB_PERMANENT, RMQ_SCOPE_DESTINATION, b->why);
		return false;
	}
	return true;
}

static const char *write_stop(struct batch *b, int64_t now);

/* Writes slot i (reopening the channel if the broker closed it). false
 * when the flight must stop writing. */
static bool slot_send(struct batch *b, size_t i)
{
	struct rmq_state *st = b->st;
	struct flight *fl = b->fl;

	if (b->ctx && b->ctx->may_send && !b->ctx->may_send(b->ctx, i)) {
		rmq_settle_unsent(
		    fl, i,
		    "not sent: the lease or its deadline no longer "
		    "allows it");
		return true;
	}
	if (fl->slots[i].writes >= MAX_WRITES) {
		rmq_settle_unsent(
		    fl, i, "not sent: the broker closed the channel again");
		return true;
	}
	if (!slot_build(b, i))
		return true;
	if (!st->channel_open) {
		rmq_cork(st, false);
		/* Too little time to wait for the broker's answer: an RPC
		 * that times out costs the connection. */
		if (fl->deadline - clock_ms() < REOPEN_MIN_MS) {
			rmq_settle_unsent(fl, i,
					  "not sent: too little time left "
					  "before the publish deadline to "
					  "open a channel");
			return true;
		}
		if (rmq_channel_open(st, fl->deadline, b->why,
				     sizeof(b->why)) != 0) {
			b->cursor = i;
			if (!fl->lost) {
				fl->lost = true;
				rmq_set_reason(fl->lost_why,
					       sizeof(fl->lost_why), "%s",
					       b->why);
			}
			return false;
		}
		fl->base_tag = fl->low_tag = st->next_tag;
		fl->ntags = 0;
		/* The reopen took time: the deadline or the lease may no
		 * longer allow the row (asked again at the loop's next
		 * turn). */
		if (write_stop(b, clock_ms()) ||
		    (b->ctx && b->ctx->may_send &&
		     !b->ctx->may_send(b->ctx, i))) {
			b->cursor = i;
			return true;
		}
	}
	rmq_cork(st, true);
	if (write_slot(st, i) != 0)
		return false;
	if (++b->since_pump < PUMP_EVERY && b->cursor < fl->n)
		return true;
	b->since_pump = 0;
	rmq_pump_ready(st);
	if (!st->channel_open)
		b->cursor = 0; /* requeued slots to rewrite */
	return true;
}

/* Why nothing more may be written now, or NULL when it may. */
static const char *write_stop(struct batch *b, int64_t now)
{
	if (b->shutdown)
		return "not sent: shutting down";
	if (b->st->blocked) {
		blocked_reason(b->st, b->why, sizeof(b->why));
		return b->why;
	}
	if (now >= b->fl->deadline)
		return "not sent: the publish deadline passed";
	return NULL;
}

/* Writes what may be written, then awaits the outcomes until every one is
 * in, the deadline passes or the connection goes. */
static void flight_run(struct batch *b)
{
	struct flight *fl = b->fl;

	for (;;) {
		int64_t now = clock_ms();
		const char *stop;
		int64_t wait;

		if (b->ctx && b->ctx->tick && now - b->last_tick >= TICK_MS) {
			b->shutdown = b->ctx->tick(b->ctx) || b->shutdown;
			b->last_tick = now;
		}
		if (fl->lost)
			break;
		while (b->cursor < fl->n &&
		       fl->slots[b->cursor].state != SLOT_UNSENT)
			b->cursor++;
		stop = write_stop(b, now);
		if (stop) {
			b->unsent_why = stop;
		} else if (b->cursor < fl->n) {
			if (!slot_send(b, b->cursor++))
				break;
			continue;
		}
		/* Nothing more may be written now: await what was. */
		if (fl->unsettled == 0 || now >= fl->deadline)
			break; /* past the deadline, what is open is in doubt */
		wait = fl->deadline - now;
		if (rmq_pump_one(b->st, wait > TICK_MS ? TICK_MS : wait) < 0)
			break;
		if (!b->st->channel_open)
			b->cursor = 0;
	}
}

static int rmq_publish(void *state, const struct outbox_event *events, size_t n,
		       struct publish_ctx *ctx, struct pub_result *results)
{
	struct rmq_state *st = state;
	struct flight fl = {
	    .n = n,
	    .results = results,
	    .mandatory = true,
	    .deadline =
		ctx ? ctx->deadline_ms : clock_ms() + rmq_timeout_ms(st->cfg),
	};
	struct batch b = {
	    .st = st,
	    .fl = &fl,
	    .ctx = ctx,
	    .events = events,
	    .last_tick = clock_ms(),
	    .unsent_why = "not handed to the broker",
	};
	int rc = 0;

	if (n == 0)
		return 0;
	if (flight_init(&fl, st->cfg, events) != 0)
		goto out;
	st->fl = &fl;
	if (flight_ready(&b))
		flight_run(&b);
	rmq_cork(st, false);
	rc = flight_finish(st, b.unsent_why);
	st->fl = NULL;
	for (size_t i = 0; i < n; i++)
		rmq_msg_release(&fl.slots[i].msg);
	if (st->conn && !amqp_frames_enqueued(st->conn))
		amqp_maybe_release_buffers(st->conn);
out:
	free(fl.slots);
	free(fl.by_tag);
	return rc;
}

/* A real confirmed publish: an empty, transient message to the default
 * exchange under a reserved routing key, not mandatory (the broker
 * confirms an unroutable one at once) and expiring at once should a
 * queue of that name exist. */
static int rmq_probe(void *state, char *err, size_t errlen)
{
	struct rmq_state *st = state;
	struct slot slot = {
	    .id = "",
	    .exchange = "",
	    .routing_key = PROBE_ROUTING_KEY,
	    .built = true,
	};
	struct pub_result result = {.outcome = PUB_NOT_WRITTEN};
	size_t by_tag[1];
	struct flight fl = {
	    .slots = &slot,
	    .results = &result,
	    .n = 1,
	    .mandatory = false,
	    .deadline = clock_ms() + rmq_timeout_ms(st->cfg),
	    .by_tag = by_tag,
	};
	amqp_basic_properties_t *p = &slot.msg.props;

	if (st->conn)
		rmq_pump_ready(st);
	if (st->conn && st->blocked) {
		rmq_set_reason(err, errlen,
			       "amqp broker %s: broker blocked the "
			       "connection: %s",
			       st->where, st->blocked_why);
		return -1;
	}
	if (!st->conn && rmq_conn_open(st, err, errlen) != 0)
		return -1;
	if (!st->channel_open &&
	    rmq_channel_open(st, fl.deadline, err, errlen) != 0)
		return -1;

	slot.msg.exchange = amqp_cstring_bytes("");
	slot.msg.routing_key = amqp_cstring_bytes(PROBE_ROUTING_KEY);
	slot.msg.body = amqp_empty_bytes;
	p->_flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_EXPIRATION_FLAG |
		    AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_TYPE_FLAG;
	p->delivery_mode = 1;
	p->expiration = amqp_cstring_bytes("0");
	p->app_id = amqp_cstring_bytes(RMQ_MAP_APP_ID);
	p->type = amqp_cstring_bytes(PROBE_ROUTING_KEY);

	st->fl = &fl;
	fl.base_tag = fl.low_tag = st->next_tag;
	if (write_slot(st, 0) == 0) {
		while (fl.unsettled > 0 && !fl.lost && !st->blocked &&
		       clock_ms() < fl.deadline) {
			int64_t wait = fl.deadline - clock_ms();

			if (rmq_pump_one(st, wait > TICK_MS ? TICK_MS : wait) <
			    0)
				break;
		}
	}
	if (fl.unsettled > 0 && st->blocked && !fl.lost) {
		/* Its confirm comes only after the block lifts; this channel
		 * must not deliver it to a later batch. */
		rmq_settle(&fl, 0, PUB_TRANSPORT, RMQ_SCOPE_DESTINATION,
			   "blocked");
		rmq_channel_abandon(st);
		st->fl = NULL;
		rmq_set_reason(err, errlen,
			       "amqp broker %s: broker blocked the "
			       "connection: %s",
			       st->where, st->blocked_why);
		return -1;
	}
	flight_finish(st, "probe not sent");
	st->fl = NULL;
	if (result.outcome == PUB_ACKED)
		return 0;
	rmq_set_reason(err, errlen, "amqp broker %s: probe publish failed: %s",
		       st->where, result.reason);
	return -1;
}

static void rmq_service(void *state)
{
	struct rmq_state *st = state;

	if (!st || !st->conn)
		return;
	/* Reading is what answers heartbeats in librabbitmq 0.11, and it
	 * picks up connection.blocked/unblocked and connection.close. */
	rmq_pump_ready(st);
	if (st->conn && !amqp_frames_enqueued(st->conn))
		amqp_maybe_release_buffers(st->conn);
}

static void rmq_close(void *state)
{
	state_free(state);
}

const struct publisher_ops publisher_amqp = {
    .name = "amqp",
    .settings = &rmq_settings_group,
    .default_destination = rmq_default_destination,
    .validate = rmq_validate,
    .warn_links = rmq_warn_links,
    .open = rmq_open,
    .publish = rmq_publish,
    .probe = rmq_probe,
    .service = rmq_service,
    .close = rmq_close,
};
