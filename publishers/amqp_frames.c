/* SPDX-License-Identifier: MIT */
/*
 * What the broker sends back while a flight is awaited: confirms (ack,
 * nack), returned messages, channel and connection closes, blocks; and
 * the frame pump that reads them.
 */
#include "amqp_conn.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>

#include "encode/encode.h"

/* ---- the flight: outcomes of what was written ---- */

void rmq_settle(struct flight *fl, size_t i, enum pub_outcome outcome,
		enum rmq_scope scope, const char *reason)
{
	struct slot *s = &fl->slots[i];
	struct pub_result *r = &fl->results[i];

	if (s->state == SLOT_DONE)
		return;
	if (s->state == SLOT_WRITTEN)
		fl->unsettled--;
	s->state = SLOT_DONE;
	r->outcome = outcome;
	r->route_scoped = scope == RMQ_SCOPE_ROUTE;
	if (reason != r->reason)
		rmq_set_reason(r->reason, sizeof(r->reason), "%s",
			       outcome == PUB_ACKED ? "" : reason);
}

/* An unwritten slot given up: in doubt from an earlier write, or never
 * handed over. */
void rmq_settle_unsent(struct flight *fl, size_t i, const char *why)
{
	struct slot *s = &fl->slots[i];

	if (s->doubt)
		rmq_settle(fl, i, PUB_TRANSPORT, RMQ_SCOPE_DESTINATION,
			   fl->results[i].reason);
	else
		rmq_settle(fl, i, PUB_NOT_WRITTEN, RMQ_SCOPE_DESTINATION, why);
}

static void on_ack(struct rmq_state *st, struct flight *fl, size_t i)
{
	struct slot *s = &fl->slots[i];

	if (!s->returned) {
		rmq_settle(fl, i, PUB_ACKED, RMQ_SCOPE_DESTINATION, "");
		return;
	}
	if (rmq_settings_of(st->cfg)->unroutable == UNROUTABLE_FAIL)
		rmq_settle(fl, i, PUB_PERMANENT, RMQ_SCOPE_DESTINATION,
			   s->return_why);
	else
		rmq_settle(fl, i, PUB_DESTINATION, RMQ_SCOPE_ROUTE,
			   s->return_why);
}

/* What the broker said of a delivery tag. */
enum confirm { CONFIRM_ACK, CONFIRM_NACK };

static void on_confirm(struct rmq_state *st, uint64_t tag, bool multiple,
		       enum confirm said)
{
	struct flight *fl = st->fl;
	uint64_t lo, hi, end;

	if (!fl || fl->ntags == 0)
		return;
	end = fl->base_tag + fl->ntags; /* one past the last written tag */
	lo = multiple ? fl->low_tag : tag;
	hi = multiple && tag == 0 ? end - 1 : tag;
	if (lo < fl->base_tag)
		lo = fl->base_tag;
	if (hi >= end)
		hi = end - 1;
	for (uint64_t t = lo; t <= hi && t >= lo; t++) {
		size_t i = fl->by_tag[t - fl->base_tag];
		struct slot *s = &fl->slots[i];

		if (s->state != SLOT_WRITTEN || s->tag != t)
			continue;
		if (said == CONFIRM_NACK)
			rmq_settle(
			    fl, i, PUB_EVENT, RMQ_SCOPE_DESTINATION,
			    "the broker refused the message (basic.nack)");
		else
			on_ack(st, fl, i);
	}
	fl->confirms++;
	while (fl->low_tag < end) {
		struct slot *s =
		    &fl->slots[fl->by_tag[fl->low_tag - fl->base_tag]];

		if (s->state == SLOT_WRITTEN && s->tag == fl->low_tag)
			break;
		fl->low_tag++;
	}
}

static void quote_exchange(char *dst, size_t dstlen, const char *exchange)
{
	if (!*exchange) {
		rmq_set_reason(dst, dstlen, "the default exchange");
		return;
	}
	char quoted[80];

	cloudevent_quote(quoted, sizeof(quoted), exchange, strlen(exchange),
			 64);
	rmq_set_reason(dst, dstlen, "exchange '%s'", quoted);
}

static void on_channel_close(struct rmq_state *st, const amqp_frame_t *f);
static void on_connection_close(struct rmq_state *st, const amqp_frame_t *f);

/*
 * Reads the content of a returned message off the connection and copies
 * its message id into id ("" when it has none). Returns -1 when the
 * connection or channel went instead (already handled).
 */
static int return_read(struct rmq_state *st, const amqp_frame_t *f, char *id,
		       size_t idlen)
{
	amqp_message_t msg;
	amqp_rpc_reply_t r;

	/* The content follows the method at once; the deadline may have
	 * passed while the return was on its way. */
	rmq_watchdog_arm(st, clock_ms() + rmq_timeout_ms(st->cfg));
	r = amqp_read_message(st->conn, f->channel, &msg, 0);
	if (rmq_watchdog_disarm(st)) {
		if (r.reply_type == AMQP_RESPONSE_NORMAL)
			amqp_destroy_message(&msg);
		rmq_conn_drop(st, "reading a returned message timed out");
		return -1;
	}
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD ||
	     r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)) {
		/* The broker closed instead of sending the content. */
		amqp_frame_t closing = {.frame_type = AMQP_FRAME_METHOD,
					.channel = f->channel};

		closing.payload.method = r.reply;
		if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
			on_channel_close(st, &closing);
		else
			on_connection_close(st, &closing);
		return -1;
	}
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		char why[160], lost[200];

		rmq_map_describe_reply(r, why, sizeof(why));
		rmq_set_reason(lost, sizeof(lost),
			       "reading a returned message failed: %s", why);
		rmq_conn_drop(st, lost);
		return -1;
	}
	if (msg.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG)
		rmq_set_reason(id, idlen, "%.*s",
			       (int)msg.properties.message_id.len,
			       (const char *)msg.properties.message_id.bytes);
	amqp_destroy_message(&msg);
	return 0;
}

/* The open slot a return is about: by id; else the oldest open message to
 * the same place, since the broker routes a channel's messages in order.
 * SIZE_MAX when none. */
static size_t return_match(const struct flight *fl, const char *id,
			   const char *exchange, const char *rkey)
{
	size_t match = SIZE_MAX;

	for (size_t i = 0; i < fl->n && *id; i++) {
		const struct slot *s = &fl->slots[i];

		if (s->state == SLOT_WRITTEN && !s->returned && s->id &&
		    strcmp(s->id, id) == 0)
			match = i;
	}
	for (uint64_t t = fl->low_tag;
	     match == SIZE_MAX && t < fl->base_tag + fl->ntags; t++) {
		size_t i = fl->by_tag[t - fl->base_tag];
		const struct slot *s = &fl->slots[i];

		if (s->state == SLOT_WRITTEN && s->tag == t && !s->returned &&
		    strcmp(s->exchange, exchange) == 0 &&
		    strcmp(s->routing_key, rkey) == 0)
			match = i;
	}
	return match;
}

/* basic.return: the message comes back before its ack. Its header and
 * body frames follow and must be read off the connection. */
static void on_return(struct rmq_state *st, const amqp_frame_t *f)
{
	const amqp_basic_return_t *ret = f->payload.method.decoded;
	struct flight *fl = st->fl;
	char exchange[256], rkey[256], code[200], id[256] = "";
	char where[100], quoted[80];
	struct slot *s;
	size_t match;

	rmq_set_reason(exchange, sizeof(exchange), "%.*s",
		       (int)ret->exchange.len,
		       (const char *)ret->exchange.bytes);
	rmq_set_reason(rkey, sizeof(rkey), "%.*s", (int)ret->routing_key.len,
		       (const char *)ret->routing_key.bytes);
	rmq_map_describe_close(ret->reply_code, ret->reply_text, code,
			       sizeof(code));
	if (!fl)
		return; /* its content frames are dropped as they come */
	if (return_read(st, f, id, sizeof(id)) != 0)
		return;
	match = return_match(fl, id, exchange, rkey);
	if (match == SIZE_MAX)
		return;
	s = &fl->slots[match];
	quote_exchange(where, sizeof(where), exchange);
	cloudevent_quote(quoted, sizeof(quoted), rkey, strlen(rkey), 64);
	s->returned = true;
	rmq_set_reason(s->return_why, sizeof(s->return_why),
		       "unroutable: no queue bound to %s for routing key "
		       "'%s' (%s)",
		       where, quoted, code);
}

/* Whether the refusal the broker closed the channel with applies to
 * slot s. */
static bool refused(const struct rmq_refusal *ref, const struct slot *s)
{
	switch (ref->kind) {
	case RMQ_REFUSAL_EXCHANGE:
		return strcmp(s->exchange, ref->exchange) == 0;
	case RMQ_REFUSAL_ROUTE:
		return strcmp(s->exchange, ref->exchange) == 0 &&
		       strcmp(s->routing_key, ref->routing_key) == 0;
	case RMQ_REFUSAL_TOO_LARGE:
		return s->built && s->msg.body.len > ref->max_size;
	case RMQ_REFUSAL_OTHER:
		break;
	}
	return false;
}

/* A refusal whose text we cannot read still names no exchange; if
 * everything open went to one exchange, it is that one. */
static void refusal_guess_exchange(const struct flight *fl, uint16_t code,
				   struct rmq_refusal *ref)
{
	const char *only = NULL;
	bool one = true;

	if (ref->kind != RMQ_REFUSAL_OTHER ||
	    (code != AMQP_NOT_FOUND && code != AMQP_ACCESS_REFUSED))
		return;
	for (size_t i = 0; i < fl->n && one; i++) {
		const struct slot *s = &fl->slots[i];

		if (s->state != SLOT_WRITTEN)
			continue;
		if (only && strcmp(only, s->exchange) != 0)
			one = false;
		only = s->exchange;
	}
	if (one && only && strlen(only) < sizeof(ref->exchange)) {
		ref->kind = RMQ_REFUSAL_EXCHANGE;
		snprintf(ref->exchange, sizeof(ref->exchange), "%s", only);
	}
}

/* The outcome of slot i, which the refusal names. */
static void refusal_settle(struct flight *fl, size_t i,
			   const struct rmq_refusal *ref, const char *why)
{
	const struct slot *s = &fl->slots[i];
	char reason[256];

	if (ref->kind == RMQ_REFUSAL_TOO_LARGE) {
		rmq_set_reason(
		    reason, sizeof(reason),
		    "message too large: body of %zu bytes is over the "
		    "broker's max_message_size of %llu bytes",
		    s->msg.body.len, (unsigned long long)ref->max_size);
		rmq_settle(fl, i, PUB_PERMANENT, RMQ_SCOPE_DESTINATION, reason);
	} else {
		rmq_set_reason(reason, sizeof(reason),
			       "broker refused the destination: %s", why);
		rmq_settle(fl, i, PUB_DESTINATION,
			   ref->kind == RMQ_REFUSAL_ROUTE
			       ? RMQ_SCOPE_ROUTE
			       : RMQ_SCOPE_DESTINATION,
			   reason);
	}
}

/* After a channel.close: refused slots settle, the other written ones go
 * back to be written again, in doubt when they preceded the failure. */
static void refusal_apply(struct flight *fl, const struct rmq_refusal *ref,
			  const char *why)
{
	uint64_t first_fail = UINT64_MAX;
	char doubt[256];

	for (size_t i = 0; i < fl->n; i++) {
		const struct slot *s = &fl->slots[i];

		if (s->state == SLOT_WRITTEN && refused(ref, s) &&
		    s->tag < first_fail)
			first_fail = s->tag;
	}
	rmq_set_reason(doubt, sizeof(doubt),
		       "outcome unknown: the broker closed the channel (%s)",
		       why);
	for (size_t i = 0; i < fl->n; i++) {
		struct slot *s = &fl->slots[i];

		if (s->state == SLOT_DONE)
			continue;
		if (refused(ref, s)) {
			refusal_settle(fl, i, ref, why);
			continue;
		}
		if (s->state != SLOT_WRITTEN)
			continue;
		s->state = SLOT_UNSENT;
		fl->unsettled--;
		if (first_fail == UINT64_MAX || s->tag < first_fail) {
			s->doubt = true;
			rmq_set_reason(fl->results[i].reason,
				       sizeof(fl->results[i].reason), "%s",
				       doubt);
		}
	}
	fl->ntags = 0;
}

/*
 * channel.close from the broker. Everything after the failing publish was
 * discarded by the broker; what came before it was processed and may
 * have been routed. Messages the refusal names get their outcome now;
 * the others go back to be written on a new channel.
 */
static void on_channel_close(struct rmq_state *st, const amqp_frame_t *f)
{
	const amqp_channel_close_t *c = f->payload.method.decoded;
	uint16_t code = c->reply_code;
	amqp_channel_close_ok_t ok = {0};
	struct rmq_refusal ref;
	char why[200];
	int rc;

	rmq_map_describe_close(c->reply_code, c->reply_text, why, sizeof(why));
	rmq_refusal_parse(c->reply_code, c->reply_text.bytes, c->reply_text.len,
			  &ref);
	st->channel_open = false;
	log_fields(LOG_WARN, "amqp channel closed by the broker", "broker",
		   st->where, "reason", why, NULL);
	rmq_watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS);
	rc = amqp_send_method(st->conn, st->channel,
			      AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
	/* Dropping the connection frees the frame: c is not used after. */
	if (rmq_watchdog_disarm(st) || rc != AMQP_STATUS_OK)
		rmq_conn_drop(st, "answering channel.close failed");
	if (!st->fl)
		return;
	refusal_guess_exchange(st->fl, code, &ref);
	refusal_apply(st->fl, &ref, why);
}

static void on_connection_close(struct rmq_state *st, const amqp_frame_t *f)
{
	const amqp_connection_close_t *c = f->payload.method.decoded;
	amqp_connection_close_ok_t ok = {0};
	char code[200], why[256];

	rmq_map_describe_close(c->reply_code, c->reply_text, code,
			       sizeof(code));
	rmq_set_reason(why, sizeof(why),
		       "the broker closed the connection (%s)", code);
	rmq_watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS);
	amqp_send_method(st->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
	rmq_watchdog_disarm(st);
	rmq_conn_drop(st, why);
}

static void on_blocked(struct rmq_state *st, const amqp_frame_t *f)
{
	const amqp_connection_blocked_t *b = f->payload.method.decoded;
	char quoted[100];

	cloudevent_quote(quoted, sizeof(quoted), b->reason.bytes, b->reason.len,
			 80);
	st->blocked = true;
	rmq_set_reason(st->blocked_why, sizeof(st->blocked_why), "%s", quoted);
	log_fields(LOG_WARN,
		   "amqp broker blocked the connection; publishing "
		   "paused",
		   "broker", st->where, "reason", quoted, NULL);
}

static void handle_frame(struct rmq_state *st, const amqp_frame_t *f)
{
	if (f->frame_type != AMQP_FRAME_METHOD)
		return; /* content of a message returned on an old channel */
	if (f->channel == 0) {
		switch (f->payload.method.id) {
		case AMQP_CONNECTION_BLOCKED_METHOD:
			on_blocked(st, f);
			break;
		case AMQP_CONNECTION_UNBLOCKED_METHOD:
			if (st->blocked)
				log_fields(LOG_INFO,
					   "amqp broker unblocked the "
					   "connection",
					   "broker", st->where, NULL);
			st->blocked = false;
			break;
		case AMQP_CONNECTION_CLOSE_METHOD:
			on_connection_close(st, f);
			break;
		default:
			break;
		}
		return;
	}
	if (f->channel == st->closing &&
	    f->payload.method.id == AMQP_CHANNEL_CLOSE_OK_METHOD) {
		st->closing = 0; /* no frame of it can follow */
		return;
	}
	if (f->channel != st->channel || !st->channel_open)
		return; /* a channel we closed: its late frames mean nothing */
	switch (f->payload.method.id) {
	case AMQP_BASIC_ACK_METHOD: {
		const amqp_basic_ack_t *a = f->payload.method.decoded;

		on_confirm(st, a->delivery_tag, a->multiple, CONFIRM_ACK);
		break;
	}
	case AMQP_BASIC_NACK_METHOD: {
		const amqp_basic_nack_t *a = f->payload.method.decoded;

		on_confirm(st, a->delivery_tag, a->multiple, CONFIRM_NACK);
		break;
	}
	case AMQP_BASIC_RETURN_METHOD:
		on_return(st, f);
		break;
	case AMQP_CHANNEL_CLOSE_METHOD:
		on_channel_close(st, f);
		break;
	default:
		break;
	}
}

/* librabbitmq 0.11 sends each message as three send() calls with
 * TCP_NODELAY, so every message became its own TCP segment, and on
 * loopback the sender is charged for the receiver's half of each too.
 * Corked between looks at the broker's frames, the messages written in
 * between leave as a few full segments. Uncorking flushes, and happens
 * before anything waits for the broker or answers it. A failed setsockopt
 * only costs that coalescing, so it is not an error. */
void rmq_cork(struct rmq_state *st, bool on)
{
	int v = on ? 1 : 0;

	if (!st->conn || st->corked == on)
		return;
	if (setsockopt(amqp_get_sockfd(st->conn), IPPROTO_TCP, TCP_CORK, &v,
		       sizeof(v)) == 0)
		st->corked = on;
	else
		st->corked = false;
}

/* Waits up to ms for one frame and handles it. 1 handled, 0 nothing
 * came, -1 the connection is gone. */
int rmq_pump_one(struct rmq_state *st, int64_t ms)
{
	struct timeval tv = rmq_tv_of(ms);
	amqp_frame_t f;
	int rc;

	if (!st->conn)
		return -1;
	rmq_cork(st, false);
	/* librabbitmq sends a heartbeat that is due before it reads, a
	 * write with no deadline of its own: to a broker that stopped
	 * reading (an alarm, a peer gone) it would hold the lane, and the
	 * publisher with it, until TCP gave up. */
	rmq_watchdog_arm(st, clock_ms() + ms + CLOSE_TIMEOUT_MS);
	rc = amqp_simple_wait_frame_noblock(st->conn, &f, &tv);
	if (rmq_watchdog_disarm(st)) {
		rmq_conn_drop(st,
			      "connection to the broker lost: a heartbeat's "
			      "write stuck past its deadline");
		return -1;
	}
	if (rc == AMQP_STATUS_TIMEOUT)
		return 0;
	if (rc != AMQP_STATUS_OK) {
		char why[160], lost[200];

		rmq_describe_status(rc, why, sizeof(why));
		rmq_set_reason(lost, sizeof(lost),
			       "connection to the broker lost: %s", why);
		rmq_conn_drop(st, lost);
		return -1;
	}
	handle_frame(st, &f);
	/* Decoded frames live in the connection's pools until released;
	 * queued frames (an RPC put them aside) still need theirs. */
	if (st->conn && !amqp_frames_enqueued(st->conn))
		amqp_maybe_release_buffers(st->conn);
	return st->conn ? 1 : -1;
}

/* Handles every frame already in, without waiting. */
void rmq_pump_ready(struct rmq_state *st)
{
	while (rmq_pump_one(st, 0) > 0)
		;
}
