/* SPDX-License-Identifier: MIT */
/*
 * The AMQP 0-9-1 backend (RabbitMQ, librabbitmq 0.11): persistent,
 * mandatory publishes with publisher confirms, pipelined per batch and
 * awaited in a frame loop, since 0.11 has no confirm-wait helper. The
 * message mapping lives in amqp_map.c; this file only talks to the broker.
 *
 * One connection and one channel per worker state. Channel numbers move
 * on at every reopen and frames for any other channel are dropped, so a
 * late confirm from a closed channel can never settle a later batch.
 */
#include "backends.h"

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

#ifndef OUTBOX_VERSION
#define OUTBOX_VERSION "unknown"
#endif

/* Debian's bundle of the system's trusted CAs: amqps:// verifies the
 * broker's certificate and host name against it. */
#define CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"
#define HEARTBEAT_S 30
#define FRAME_MAX 131072
/* publish_ctx.tick is due every 200 ms; ticking at half that and waiting
 * for frames in slices no longer keeps the promise with room to spare. */
#define TICK_MS 100
/* How often one event may be written within one publish() call: a second
 * write only follows a channel error caused by another event. */
#define MAX_WRITES 2
/* Writes between looks at what the broker sent back. Each look is a
 * poll(2); looking after every write cost more CPU than the rest of the
 * publish. A channel close or a block is still seen within this many
 * messages, and what was written after it is requeued as before. */
#define PUMP_EVERY 32
#define PROBE_ROUTING_KEY "outbox-relay.probe"
#define CLOSE_TIMEOUT_MS 2000

/* Breaks a socket call stuck past its deadline: librabbitmq 0.11 writes
 * with an infinite timeout, so a broker that stops reading (a resource
 * alarm, a black-holed peer) would hang the worker. Shutting the socket
 * down makes the stuck call fail. */
struct watchdog {
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool started;
	bool stop;	  /* under lock */
	int fd;		  /* under lock: armed socket, -1 when disarmed */
	int64_t deadline; /* under lock: clock_ms() */
	bool fired;	  /* under lock: shut fd down since the arm */
	/* Under lock: when the watchdog thread wakes up by itself next
	 * (INT64_MAX while it waits for an arm). Arming signals it only to
	 * wake it sooner, so a batch whose publishes share one deadline does
	 * not wake another thread per message. */
	int64_t wakes_at;
};

enum slot_state { SLOT_UNSENT, SLOT_WRITTEN, SLOT_DONE };

/* One event of a flight. */
struct slot {
	struct amqp_msg msg;
	bool built;
	enum slot_state state;
	const char *id;	      /* message_id, for matching basic.return */
	const char *exchange; /* where it goes, before the msg is built */
	const char *routing_key;
	uint64_t tag; /* SLOT_WRITTEN: delivery tag on st->channel */
	int writes;
	bool returned; /* basic.return seen; the ack that follows is no success
			*/
	char return_why[256];
	/* Written on a channel that closed without a confirm, so the broker
	 * may have it: if it is not written again, its outcome is unknown.
	 * results[i].reason says why meanwhile. */
	bool doubt;
};

/* The events of one publish() (or the probe) while they are awaited. */
struct flight {
	struct slot *slots;
	struct pub_result *results;
	size_t n;
	bool mandatory;
	int64_t deadline; /* clock_ms() */
	size_t *by_tag;	  /* slot of tag base_tag + k, k < ntags */
	size_t ntags;
	uint64_t base_tag; /* first tag of this flight on st->channel */
	uint64_t low_tag;  /* no open slot has a lower tag */
	size_t unsettled;  /* slots in SLOT_WRITTEN */
	size_t confirms;   /* acks and nacks received */
	bool lost;	   /* the connection is gone */
	char lost_why[256];
};

struct amqp_state {
	const struct config *cfg;
	char *url; /* private copy: amqp_parse_url() points ci into it */
	struct amqp_connection_info ci;
	char where[200]; /* "host:port, vhost '/'" for messages */
	char conn_name[160];
	amqp_connection_state_t conn; /* NULL while disconnected */
	amqp_channel_t channel;	      /* current channel number */
	bool channel_open;	      /* open and in confirm mode */
	uint16_t channel_max;
	uint64_t next_tag; /* delivery tag of the next publish on channel */
	size_t frame_max;
	bool blocked; /* connection.blocked until connection.unblocked */
	char blocked_why[128];
	struct flight *fl; /* the flight being awaited, or NULL */
	bool corked;	   /* TCP_CORK set on the connection's socket */
	struct watchdog wd;
};

static void set_reason(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Formats a reason; a cut never splits a UTF-8 character, since reasons
 * end up in last_error, a text column. */
static void set_reason(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n >= len)
		amqp_map_utf8_cut(buf);
}

static int64_t timeout_ms(const struct config *cfg)
{
	return cfg->publish_timeout_ms > 0 ? cfg->publish_timeout_ms : 5000;
}

static struct timeval tv_of(int64_t ms)
{
	if (ms < 0)
		ms = 0;
	return (struct timeval){.tv_sec = ms / 1000,
				.tv_usec = (ms % 1000) * 1000};
}

/* ---- watchdog ---- */

static void *watchdog_main(void *arg)
{
	struct watchdog *wd = arg;

	pthread_mutex_lock(&wd->lock);
	while (!wd->stop) {
		int64_t now = clock_ms();
		struct timespec ts;

		if (wd->fd < 0) {
			wd->wakes_at = INT64_MAX;
			pthread_cond_wait(&wd->cond, &wd->lock);
			continue;
		}
		if (now >= wd->deadline) {
			shutdown(wd->fd, SHUT_RDWR);
			wd->fired = true;
			wd->fd = -1;
			continue;
		}
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += (wd->deadline - now) / 1000;
		ts.tv_nsec += ((wd->deadline - now) % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		wd->wakes_at = wd->deadline;
		pthread_cond_timedwait(&wd->cond, &wd->lock, &ts);
	}
	pthread_mutex_unlock(&wd->lock);
	return NULL;
}

static int watchdog_start(struct watchdog *wd, char *err, size_t errlen)
{
	pthread_condattr_t ca;
	sigset_t all, old;
	int rc;

	wd->fd = -1;
	wd->wakes_at = INT64_MAX;
	if (pthread_condattr_init(&ca) != 0) {
		set_reason(err, errlen, "amqp: cannot create the watchdog");
		return -1;
	}
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	rc = pthread_mutex_init(&wd->lock, NULL);
	if (rc == 0 && pthread_cond_init(&wd->cond, &ca) != 0) {
		pthread_mutex_destroy(&wd->lock);
		rc = -1;
	}
	pthread_condattr_destroy(&ca);
	if (rc != 0) {
		set_reason(err, errlen, "amqp: cannot create the watchdog");
		return -1;
	}
	/* Signals belong to the process's signal thread, never to this one. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&wd->thread, NULL, watchdog_main, wd);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc != 0) {
		pthread_cond_destroy(&wd->cond);
		pthread_mutex_destroy(&wd->lock);
		char tmp[96];

		set_reason(err, errlen, "amqp: cannot start the watchdog: %s",
			   strerror_r(rc, tmp, sizeof(tmp)));
		return -1;
	}
	wd->started = true;
	return 0;
}

static void watchdog_stop(struct watchdog *wd)
{
	if (!wd->started)
		return;
	pthread_mutex_lock(&wd->lock);
	wd->stop = true;
	pthread_cond_signal(&wd->cond);
	pthread_mutex_unlock(&wd->lock);
	pthread_join(wd->thread, NULL);
	pthread_cond_destroy(&wd->cond);
	pthread_mutex_destroy(&wd->lock);
	wd->started = false;
}

/* Arms the watchdog on st's socket until deadline (clock_ms()). */
static void watchdog_arm(struct amqp_state *st, int64_t deadline)
{
	int fd = st->conn ? amqp_get_sockfd(st->conn) : -1;

	pthread_mutex_lock(&st->wd.lock);
	st->wd.fd = fd;
	st->wd.deadline = deadline;
	st->wd.fired = false;
	if (deadline < st->wd.wakes_at)
		pthread_cond_signal(&st->wd.cond);
	pthread_mutex_unlock(&st->wd.lock);
}

/* Disarms; true when the watchdog shut the socket down meanwhile. Once
 * this returns, the watchdog no longer touches the descriptor. */
static bool watchdog_disarm(struct amqp_state *st)
{
	bool fired;

	pthread_mutex_lock(&st->wd.lock);
	st->wd.fd = -1;
	fired = st->wd.fired;
	st->wd.fired = false;
	pthread_mutex_unlock(&st->wd.lock);
	return fired;
}

/* ---- describing broker and library errors (never a secret) ---- */

static void describe_status(int status, char *buf, size_t len)
{
	set_reason(buf, len, "%s", amqp_error_string2(status));
}

/*
 * librabbitmq reports every failed connect as "a socket error occurred"
 * (it connects without blocking and drops the socket's error), so a
 * failed connect is repeated here to say why: refused, unreachable, timed
 * out. Fills buf, or leaves it empty when this connect works.
 */
static void connect_diagnose(const char *host, int port, int64_t ms, char *buf,
			     size_t len)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
	char service[16], tmp[96];
	int fd = -1, e = 0, rc;

	buf[0] = '\0';
	snprintf(service, sizeof(service), "%d", port);
	rc = getaddrinfo(host, service, &hints, &res);
	if (rc != 0) {
		set_reason(buf, len, "%s", gai_strerror(rc));
		return;
	}
	fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    0);
	if (fd < 0) {
		e = errno;
	} else if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
		e = errno;
		if (e == EINPROGRESS) {
			struct pollfd p = {.fd = fd, .events = POLLOUT};
			socklen_t elen = sizeof(e);

			e = ETIMEDOUT;
			if (poll(&p, 1, (int)ms) == 1)
				getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen);
		}
	}
	if (e != 0)
		set_reason(buf, len, "%s", strerror_r(e, tmp, sizeof(tmp)));
	if (fd >= 0)
		close(fd);
	freeaddrinfo(res);
}

/* ---- connection ---- */

/* Forgets the connection without a goodbye (it is broken or the broker
 * already closed it). Everything written and unconfirmed is in doubt. */
static void conn_drop(struct amqp_state *st, const char *why)
{
	struct flight *fl = st->fl;

	if (st->conn) {
		amqp_destroy_connection(st->conn);
		st->conn = NULL;
		log_fields(LOG_WARN, "amqp connection lost", "broker",
			   st->where, "reason", why, NULL);
	}
	st->channel_open = false;
	st->blocked = false;
	st->corked = false;
	if (fl && !fl->lost) {
		fl->lost = true;
		set_reason(fl->lost_why, sizeof(fl->lost_why), "%s", why);
	}
}

/* Handles the reply of a failed RPC: answers a connection.close or a
 * channel.close and drops what they closed. */
static void rpc_failed(struct amqp_state *st, amqp_rpc_reply_t r,
		       const char *what, char *err, size_t errlen)
{
	char why[200];

	amqp_map_describe_reply(r, why, sizeof(why));
	set_reason(err, errlen, "amqp broker %s: %s failed: %s", st->where,
		   what, why);
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
		amqp_channel_close_ok_t ok = {0};

		watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS);
		int rc = amqp_send_method(st->conn, st->channel,
					  AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
		watchdog_disarm(st);
		st->channel_open = false;
		if (rc == AMQP_STATUS_OK)
			return;
	} else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
		   r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
		amqp_connection_close_ok_t ok = {0};

		watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS);
		amqp_send_method(st->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD,
				 &ok);
		watchdog_disarm(st);
	}
	/* A library error (timeout included: librabbitmq closes the socket
	 * on an RPC timeout) or a connection.close: the connection is gone. */
	conn_drop(st, err);
}

/* Opens a fresh channel in confirm mode. 0, or -1 with err set. */
static int channel_open(struct amqp_state *st, char *err, size_t errlen)
{
	amqp_rpc_reply_t r;

	st->channel = (amqp_channel_t)(st->channel % st->channel_max + 1);
	watchdog_arm(st, clock_ms() + 2 * timeout_ms(st->cfg));
	amqp_channel_open(st->conn, st->channel);
	r = amqp_get_rpc_reply(st->conn);
	if (r.reply_type == AMQP_RESPONSE_NORMAL) {
		amqp_confirm_select(st->conn, st->channel);
		r = amqp_get_rpc_reply(st->conn);
	}
	watchdog_disarm(st);
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		rpc_failed(st, r, "opening a channel", err, errlen);
		return -1;
	}
	st->channel_open = true;
	st->next_tag = 1;
	return 0;
}

/* Closes the channel without waiting: its late frames are dropped since
 * the next channel has another number. */
static void channel_abandon(struct amqp_state *st)
{
	amqp_channel_close_t c = {
	    .reply_code = AMQP_REPLY_SUCCESS,
	    .reply_text = amqp_cstring_bytes("confirm timeout"),
	};
	int rc;

	if (!st->conn || !st->channel_open)
		return;
	st->channel_open = false;
	watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS);
	rc = amqp_send_method(st->conn, st->channel, AMQP_CHANNEL_CLOSE_METHOD,
			      &c);
	if (watchdog_disarm(st) || rc != AMQP_STATUS_OK)
		conn_drop(st, "closing a channel failed");
}

static amqp_table_entry_t string_entry(const char *key, const char *value)
{
	amqp_table_entry_t e;

	e.key = amqp_cstring_bytes(key);
	e.value.kind = AMQP_FIELD_KIND_UTF8;
	e.value.value.bytes = amqp_cstring_bytes(value);
	return e;
}

static amqp_table_entry_t bool_entry(const char *key, bool value)
{
	amqp_table_entry_t e;

	e.key = amqp_cstring_bytes(key);
	e.value.kind = AMQP_FIELD_KIND_BOOLEAN;
	e.value.value.boolean = value;
	return e;
}

/* A TLS socket verifying peer and host name, or a plain TCP one. */
static amqp_socket_t *socket_new(struct amqp_state *st, char *err,
				 size_t errlen)
{
	amqp_socket_t *sock;
	int rc;

	if (!st->ci.ssl) {
		sock = amqp_tcp_socket_new(st->conn);
		if (!sock)
			set_reason(err, errlen, "amqp: out of memory");
		return sock;
	}
	sock = amqp_ssl_socket_new(st->conn);
	if (!sock) {
		set_reason(err, errlen,
			   "amqp broker %s: cannot create a TLS socket",
			   st->where);
		return NULL;
	}
	rc = amqp_ssl_socket_set_cacert(sock, CA_BUNDLE);
	if (rc != AMQP_STATUS_OK) {
		set_reason(err, errlen,
			   "amqp broker %s: cannot load the CA bundle %s: %s",
			   st->where, CA_BUNDLE, amqp_error_string2(rc));
		return NULL;
	}
	amqp_ssl_socket_set_verify_peer(sock, 1);
	amqp_ssl_socket_set_verify_hostname(sock, 1);
	amqp_ssl_socket_set_ssl_versions(sock, AMQP_TLSv1_2, AMQP_TLSvLATEST);
	return sock;
}

static int socket_connect(struct amqp_state *st, amqp_socket_t *sock,
			  struct timeval *tv, char *err, size_t errlen)
{
	int rc = amqp_socket_open_noblock(sock, st->ci.host, st->ci.port, tv);
	char why[160] = "";

	if (rc == AMQP_STATUS_OK)
		return 0;
	if (rc == AMQP_STATUS_SOCKET_ERROR)
		connect_diagnose(st->ci.host, st->ci.port, timeout_ms(st->cfg),
				 why, sizeof(why));
	if (!why[0])
		describe_status(rc, why, sizeof(why));
	set_reason(err, errlen, "amqp broker %s: cannot connect: %s", st->where,
		   why);
	return -1;
}

static int login(struct amqp_state *st, char *err, size_t errlen)
{
	amqp_table_entry_t caps[2], props[4];
	amqp_table_t client;
	amqp_rpc_reply_t r;
	char why[200];

	/* librabbitmq merges these capabilities with its own; without
	 * connection.blocked the broker never says it stopped reading. */
	caps[0] = bool_entry("connection.blocked", true);
	caps[1] = bool_entry("authentication_failure_close", true);
	props[0] = string_entry("product", "outbox-relay");
	props[1] = string_entry("version", OUTBOX_VERSION);
	props[2] = string_entry("connection_name", st->conn_name);
	props[3].key = amqp_cstring_bytes("capabilities");
	props[3].value.kind = AMQP_FIELD_KIND_TABLE;
	props[3].value.value.table.num_entries = 2;
	props[3].value.value.table.entries = caps;
	client.num_entries = 4;
	client.entries = props;
	watchdog_arm(st, clock_ms() + 2 * timeout_ms(st->cfg));
	r = amqp_login_with_properties(
	    st->conn, st->ci.vhost, 0, FRAME_MAX, HEARTBEAT_S, &client,
	    AMQP_SASL_METHOD_PLAIN, st->ci.user, st->ci.password);
	watchdog_disarm(st);
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 0;
	amqp_map_describe_reply(r, why, sizeof(why));
	set_reason(err, errlen, "amqp broker %s: login as user '%s' failed: %s",
		   st->where, st->ci.user, why);
	return -1;
}

/* OUTBOX_AMQP_DECLARE_EXCHANGE: a durable topic exchange. */
static int exchange_declare(struct amqp_state *st, char *err, size_t errlen)
{
	const char *exchange = amqp_settings(st->cfg)->exchange;
	char what[320], quoted[80];
	amqp_rpc_reply_t r;

	watchdog_arm(st, clock_ms() + 2 * timeout_ms(st->cfg));
	amqp_exchange_declare(
	    st->conn, st->channel, amqp_cstring_bytes(exchange),
	    amqp_cstring_bytes("topic"), 0, 1, 0, 0, amqp_empty_table);
	r = amqp_get_rpc_reply(st->conn);
	watchdog_disarm(st);
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 0;
	cloudevent_quote(quoted, sizeof(quoted), exchange, strlen(exchange),
			 64);
	set_reason(what, sizeof(what), "declaring exchange '%s'", quoted);
	rpc_failed(st, r, what, err, errlen);
	return -1;
}

/* Connects, logs in, opens the confirm channel and declares the exchange
 * when configured. 0, or -1 with err naming host and vhost. */
static int conn_open(struct amqp_state *st, char *err, size_t errlen)
{
	struct timeval tv = tv_of(timeout_ms(st->cfg));
	amqp_socket_t *sock;

	st->conn = amqp_new_connection();
	if (!st->conn) {
		set_reason(err, errlen, "amqp: out of memory");
		return -1;
	}
	sock = socket_new(st, err, errlen);
	if (!sock || socket_connect(st, sock, &tv, err, errlen) != 0)
		goto fail;
	amqp_set_handshake_timeout(st->conn, &tv);
	amqp_set_rpc_timeout(st->conn, &tv);
	if (login(st, err, errlen) != 0)
		goto fail;
	st->channel_max = (uint16_t)amqp_get_channel_max(st->conn);
	if (st->channel_max == 0)
		st->channel_max = 65535;
	st->frame_max = (size_t)amqp_get_frame_max(st->conn);
	st->blocked = false;
	st->channel_open = false;
	if (channel_open(st, err, errlen) != 0)
		goto fail;
	if (amqp_settings(st->cfg)->declare_exchange &&
	    exchange_declare(st, err, errlen) != 0)
		goto fail;
	log_fields(LOG_INFO, "amqp connected", "broker", st->where, NULL);
	return 0;
fail:
	if (st->conn) {
		amqp_destroy_connection(st->conn);
		st->conn = NULL;
	}
	st->channel_open = false;
	return -1;
}

/* Says goodbye politely (bounded), then frees the connection. */
static void conn_close(struct amqp_state *st)
{
	struct timeval tv = tv_of(CLOSE_TIMEOUT_MS);

	if (!st->conn)
		return;
	/* A blocked broker reads nothing, so it would never answer. */
	if (!st->blocked) {
		amqp_set_rpc_timeout(st->conn, &tv);
		watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS + 500);
		amqp_connection_close(st->conn, AMQP_REPLY_SUCCESS);
		watchdog_disarm(st);
	}
	amqp_destroy_connection(st->conn);
	st->conn = NULL;
	st->channel_open = false;
}

/* ---- the flight: outcomes of what was written ---- */

static void settle(struct flight *fl, size_t i, enum pub_outcome outcome,
		   bool route_scoped, const char *reason)
{
	struct slot *s = &fl->slots[i];
	struct pub_result *r = &fl->results[i];

	if (s->state == SLOT_DONE)
		return;
	if (s->state == SLOT_WRITTEN)
		fl->unsettled--;
	s->state = SLOT_DONE;
	r->outcome = outcome;
	r->route_scoped = route_scoped;
	if (reason != r->reason)
		set_reason(r->reason, sizeof(r->reason), "%s",
			   outcome == PUB_ACKED ? "" : reason);
}

/* An unwritten slot given up: in doubt from an earlier write, or never
 * handed over. */
static void settle_unsent(struct flight *fl, size_t i, const char *why)
{
	struct slot *s = &fl->slots[i];

	if (s->doubt)
		settle(fl, i, PUB_TRANSPORT, false, fl->results[i].reason);
	else
		settle(fl, i, PUB_NOT_WRITTEN, false, why);
}

static void on_ack(struct amqp_state *st, struct flight *fl, size_t i)
{
	struct slot *s = &fl->slots[i];

	if (!s->returned) {
		settle(fl, i, PUB_ACKED, false, "");
		return;
	}
	if (amqp_settings(st->cfg)->unroutable == UNROUTABLE_FAIL)
		settle(fl, i, PUB_PERMANENT, false, s->return_why);
	else
		settle(fl, i, PUB_DESTINATION, true, s->return_why);
}

static void on_confirm(struct amqp_state *st, uint64_t tag, bool multiple,
		       bool nack)
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
		if (nack)
			settle(fl, i, PUB_EVENT, false,
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
		set_reason(dst, dstlen, "the default exchange");
		return;
	}
	char quoted[80];

	cloudevent_quote(quoted, sizeof(quoted), exchange, strlen(exchange),
			 64);
	set_reason(dst, dstlen, "exchange '%s'", quoted);
}

static void on_channel_close(struct amqp_state *st, const amqp_frame_t *f);
static void on_connection_close(struct amqp_state *st, const amqp_frame_t *f);

/*
 * Reads the content of a returned message off the connection and copies
 * its message id into id ("" when it has none). Returns -1 when the
 * connection or channel went instead (already handled).
 */
static int return_read(struct amqp_state *st, const amqp_frame_t *f, char *id,
		       size_t idlen)
{
	amqp_message_t msg;
	amqp_rpc_reply_t r;

	/* The content follows the method at once; the deadline may have
	 * passed while the return was on its way. */
	watchdog_arm(st, clock_ms() + timeout_ms(st->cfg));
	r = amqp_read_message(st->conn, f->channel, &msg, 0);
	if (watchdog_disarm(st)) {
		if (r.reply_type == AMQP_RESPONSE_NORMAL)
			amqp_destroy_message(&msg);
		conn_drop(st, "reading a returned message timed out");
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

		amqp_map_describe_reply(r, why, sizeof(why));
		set_reason(lost, sizeof(lost),
			   "reading a returned message failed: %s", why);
		conn_drop(st, lost);
		return -1;
	}
	if (msg.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG)
		set_reason(id, idlen, "%.*s",
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
static void on_return(struct amqp_state *st, const amqp_frame_t *f)
{
	const amqp_basic_return_t *ret = f->payload.method.decoded;
	struct flight *fl = st->fl;
	char exchange[256], rkey[256], code[200], id[256] = "";
	char where[100], quoted[80];
	struct slot *s;
	size_t match;

	set_reason(exchange, sizeof(exchange), "%.*s", (int)ret->exchange.len,
		   (const char *)ret->exchange.bytes);
	set_reason(rkey, sizeof(rkey), "%.*s", (int)ret->routing_key.len,
		   (const char *)ret->routing_key.bytes);
	amqp_map_describe_close(ret->reply_code, ret->reply_text, code,
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
	set_reason(s->return_why, sizeof(s->return_why),
		   "unroutable: no queue bound to %s for routing key "
		   "'%s' (%s)",
		   where, quoted, code);
}

/* Whether the refusal the broker closed the channel with applies to
 * slot s. */
static bool refused(const struct amqp_refusal *ref, const struct slot *s)
{
	switch (ref->kind) {
	case AMQP_REFUSAL_EXCHANGE:
		return strcmp(s->exchange, ref->exchange) == 0;
	case AMQP_REFUSAL_ROUTE:
		return strcmp(s->exchange, ref->exchange) == 0 &&
		       strcmp(s->routing_key, ref->routing_key) == 0;
	case AMQP_REFUSAL_TOO_LARGE:
		return s->built && s->msg.body.len > ref->max_size;
	case AMQP_REFUSAL_OTHER:
		break;
	}
	return false;
}

/* A refusal whose text we cannot read still names no exchange; if
 * everything open went to one exchange, it is that one. */
static void refusal_guess_exchange(const struct flight *fl, uint16_t code,
				   struct amqp_refusal *ref)
{
	const char *only = NULL;
	bool one = true;

	if (ref->kind != AMQP_REFUSAL_OTHER ||
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
		ref->kind = AMQP_REFUSAL_EXCHANGE;
		snprintf(ref->exchange, sizeof(ref->exchange), "%s", only);
	}
}

/* The outcome of slot i, which the refusal names. */
static void refusal_settle(struct flight *fl, size_t i,
			   const struct amqp_refusal *ref, const char *why)
{
	const struct slot *s = &fl->slots[i];
	char reason[256];

	if (ref->kind == AMQP_REFUSAL_TOO_LARGE) {
		set_reason(reason, sizeof(reason),
			   "message too large: body of %zu bytes is over the "
			   "broker's max_message_size of %llu bytes",
			   s->msg.body.len, (unsigned long long)ref->max_size);
		settle(fl, i, PUB_PERMANENT, false, reason);
	} else {
		set_reason(reason, sizeof(reason),
			   "broker refused the destination: %s", why);
		settle(fl, i, PUB_DESTINATION, ref->kind == AMQP_REFUSAL_ROUTE,
		       reason);
	}
}

/* After a channel.close: refused slots settle, the other written ones go
 * back to be written again, in doubt when they preceded the failure. */
static void refusal_apply(struct flight *fl, const struct amqp_refusal *ref,
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
	set_reason(doubt, sizeof(doubt),
		   "outcome unknown: the broker closed the channel (%s)", why);
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
			set_reason(fl->results[i].reason,
				   sizeof(fl->results[i].reason), "%s", doubt);
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
static void on_channel_close(struct amqp_state *st, const amqp_frame_t *f)
{
	const amqp_channel_close_t *c = f->payload.method.decoded;
	uint16_t code = c->reply_code;
	amqp_channel_close_ok_t ok = {0};
	struct amqp_refusal ref;
	char why[200];
	int rc;

	amqp_map_describe_close(c->reply_code, c->reply_text, why, sizeof(why));
	amqp_refusal_parse(c->reply_code, c->reply_text.bytes,
			   c->reply_text.len, &ref);
	st->channel_open = false;
	log_fields(LOG_WARN, "amqp channel closed by the broker", "broker",
		   st->where, "reason", why, NULL);
	watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS);
	rc = amqp_send_method(st->conn, st->channel,
			      AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
	/* Dropping the connection frees the frame: c is not used after. */
	if (watchdog_disarm(st) || rc != AMQP_STATUS_OK)
		conn_drop(st, "answering channel.close failed");
	if (!st->fl)
		return;
	refusal_guess_exchange(st->fl, code, &ref);
	refusal_apply(st->fl, &ref, why);
}

static void on_connection_close(struct amqp_state *st, const amqp_frame_t *f)
{
	const amqp_connection_close_t *c = f->payload.method.decoded;
	amqp_connection_close_ok_t ok = {0};
	char code[200], why[256];

	amqp_map_describe_close(c->reply_code, c->reply_text, code,
				sizeof(code));
	set_reason(why, sizeof(why), "the broker closed the connection (%s)",
		   code);
	watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS);
	amqp_send_method(st->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
	watchdog_disarm(st);
	conn_drop(st, why);
}

static void on_blocked(struct amqp_state *st, const amqp_frame_t *f)
{
	const amqp_connection_blocked_t *b = f->payload.method.decoded;
	char quoted[100];

	cloudevent_quote(quoted, sizeof(quoted), b->reason.bytes, b->reason.len,
			 80);
	st->blocked = true;
	set_reason(st->blocked_why, sizeof(st->blocked_why), "%s", quoted);
	log_fields(LOG_WARN,
		   "amqp broker blocked the connection; publishing "
		   "paused",
		   "broker", st->where, "reason", quoted, NULL);
}

static void handle_frame(struct amqp_state *st, const amqp_frame_t *f)
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
	if (f->channel != st->channel || !st->channel_open)
		return; /* a channel we closed: its late frames mean nothing */
	switch (f->payload.method.id) {
	case AMQP_BASIC_ACK_METHOD: {
		const amqp_basic_ack_t *a = f->payload.method.decoded;

		on_confirm(st, a->delivery_tag, a->multiple, false);
		break;
	}
	case AMQP_BASIC_NACK_METHOD: {
		const amqp_basic_nack_t *a = f->payload.method.decoded;

		on_confirm(st, a->delivery_tag, a->multiple, true);
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
static void cork(struct amqp_state *st, bool on)
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
static int pump_one(struct amqp_state *st, int64_t ms)
{
	struct timeval tv = tv_of(ms);
	amqp_frame_t f;
	int rc;

	if (!st->conn)
		return -1;
	cork(st, false);
	rc = amqp_simple_wait_frame_noblock(st->conn, &f, &tv);
	if (rc == AMQP_STATUS_TIMEOUT)
		return 0;
	if (rc != AMQP_STATUS_OK) {
		char why[160], lost[200];

		describe_status(rc, why, sizeof(why));
		set_reason(lost, sizeof(lost),
			   "connection to the broker lost: %s", why);
		conn_drop(st, lost);
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
static void pump_ready(struct amqp_state *st)
{
	while (pump_one(st, 0) > 0)
		;
}

/* Writes slot i on the current channel. 0, or -1 when the connection
 * broke (the slot is then in doubt). */
static int write_slot(struct amqp_state *st, size_t i)
{
	struct flight *fl = st->fl;
	struct slot *s = &fl->slots[i];
	char why[200];
	bool fired;
	int rc;

	/* A few ms of grace: the caller checked the deadline just before. */
	watchdog_arm(st, fl->deadline > clock_ms() + 50 ? fl->deadline
							: clock_ms() + 50);
	rc = amqp_basic_publish(st->conn, st->channel, s->msg.exchange,
				s->msg.routing_key, fl->mandatory, 0,
				&s->msg.props, s->msg.body);
	fired = watchdog_disarm(st);
	s->writes++;
	if (rc == AMQP_STATUS_OK && !fired) {
		s->state = SLOT_WRITTEN;
		s->tag = st->next_tag++;
		fl->by_tag[fl->ntags++] = i;
		fl->unsettled++;
		return 0;
	}
	if (fired) {
		set_reason(why, sizeof(why),
			   "publish stuck past its deadline; connection "
			   "dropped");
	} else {
		char status[160];

		describe_status(rc, status, sizeof(status));
		set_reason(why, sizeof(why),
			   "connection to the broker lost while publishing: "
			   "%s",
			   status);
	}
	/* Part of it may be on the wire: in doubt. */
	s->state = SLOT_WRITTEN;
	fl->unsettled++;
	settle(fl, i, PUB_TRANSPORT, false, why);
	conn_drop(st, why);
	return -1;
}

/* Rows with a NULL exchange go to OUTBOX_AMQP_EXCHANGE. */
static const char *amqp_default_destination(const struct config *cfg)
{
	const char *exchange = amqp_settings(cfg)->exchange;

	return exchange ? exchange : "";
}

static const char *slot_exchange(const struct config *cfg,
				 const struct outbox_event *ev)
{
	return ev->exchange ? ev->exchange : amqp_default_destination(cfg);
}

/* Ends the flight: what is still open gets its final outcome. Returns
 * what publish() returns. */
static int flight_finish(struct amqp_state *st, const char *unsent_why)
{
	struct flight *fl = st->fl;
	char why[256];
	int rc = 0;

	if (fl->lost) {
		for (size_t i = 0; i < fl->n; i++) {
			if (fl->slots[i].state == SLOT_WRITTEN)
				settle(fl, i, PUB_TRANSPORT, false,
				       fl->lost_why);
		}
		set_reason(why, sizeof(why), "not sent: %s", fl->lost_why);
		unsent_why = why;
		rc = -1;
	} else if (fl->unsettled > 0) {
		char timeout[128];

		set_reason(timeout, sizeof(timeout),
			   "outcome unknown: no confirm from the broker "
			   "within the publish deadline");
		for (size_t i = 0; i < fl->n; i++)
			if (fl->slots[i].state == SLOT_WRITTEN)
				settle(fl, i, PUB_TRANSPORT, false, timeout);
		/* Before any row is marked: a late ack on this channel
		 * must not settle the next batch's tags. */
		channel_abandon(st);
		if (fl->confirms == 0 || !st->conn)
			rc = -1;
	}
	for (size_t i = 0; i < fl->n; i++)
		if (fl->slots[i].state == SLOT_UNSENT)
			settle_unsent(fl, i, unsent_why);
	if (st->blocked || !st->conn)
		rc = -1;
	return rc;
}

/* ---- publisher_ops ---- */

static int amqp_validate(const struct config *cfg, char *err, size_t errlen)
{
	const struct amqp_settings *as = amqp_settings(cfg);
	char why[200];

	if (!as->url || !*as->url) {
		set_reason(err, errlen, "OUTBOX_AMQP_URL is not set");
		return -1;
	}
	if (amqp_url_check(as->url, why, sizeof(why)) != 0) {
		set_reason(err, errlen, "OUTBOX_AMQP_URL: %s", why);
		return -1;
	}
	if (as->declare_exchange && (!as->exchange || !*as->exchange)) {
		set_reason(err, errlen,
			   "OUTBOX_AMQP_DECLARE_EXCHANGE=on needs a non-empty "
			   "OUTBOX_AMQP_EXCHANGE (the default exchange cannot "
			   "be declared)");
		return -1;
	}
	return 0;
}

static void state_free(struct amqp_state *st)
{
	if (!st)
		return;
	conn_close(st);
	watchdog_stop(&st->wd);
	if (st->url) {
		explicit_bzero(st->url, strlen(st->url));
		free(st->url);
	}
	free(st);
}

static int amqp_open(const struct config *cfg, void **state, char *err,
		     size_t errlen)
{
	struct amqp_state *st = calloc(1, sizeof(*st));
	char host[128], quoted_vhost[80];

	if (!st) {
		set_reason(err, errlen, "amqp: out of memory");
		return -1;
	}
	st->cfg = cfg;
	st->channel_max = 1;
	if (amqp_validate(cfg, err, errlen) != 0)
		goto fail;
	st->url = strdup(amqp_settings(cfg)->url);
	if (!st->url) {
		set_reason(err, errlen, "amqp: out of memory");
		goto fail;
	}
	amqp_default_connection_info(&st->ci);
	amqp_parse_url(st->url, &st->ci);
	cloudevent_quote(quoted_vhost, sizeof(quoted_vhost), st->ci.vhost,
			 strlen(st->ci.vhost), 64);
	set_reason(st->where, sizeof(st->where), "%s:%d, vhost '%s'",
		   st->ci.host, st->ci.port, quoted_vhost);
	if (gethostname(host, sizeof(host)) != 0)
		set_reason(host, sizeof(host), "unknown");
	host[sizeof(host) - 1] = '\0';
	set_reason(st->conn_name, sizeof(st->conn_name),
		   "outbox-relay %s pid %d", host, (int)getpid());
	if (watchdog_start(&st->wd, err, errlen) != 0)
		goto fail;
	if (conn_open(st, err, errlen) != 0)
		goto fail;
	*state = st;
	return 0;
fail:
	state_free(st);
	return -1;
}

/* The reason for every event of a batch the blocked broker cannot take. */
static void blocked_reason(const struct amqp_state *st, char *buf, size_t len)
{
	set_reason(buf, len, "broker blocked the connection: %s",
		   st->blocked_why);
}

/* One publish() call: the flight and where writing it has got to. */
struct batch {
	struct amqp_state *st;
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
		set_reason(fl->results[i].reason, sizeof(fl->results[i].reason),
			   "not handed to the broker");
	}
	fl->slots = calloc(fl->n, sizeof(*fl->slots));
	fl->by_tag = calloc(fl->n, sizeof(*fl->by_tag));
	if (!fl->slots || !fl->by_tag) {
		for (size_t i = 0; i < fl->n; i++)
			set_reason(fl->results[i].reason,
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
	struct amqp_state *st = b->st;

	pump_ready(st);
	if (!st->conn) {
		set_reason(b->why, sizeof(b->why),
			   "not connected to the broker: %s",
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
	if (!st->channel_open &&
	    channel_open(st, b->why, sizeof(b->why)) != 0) {
		b->fl->lost = false;
		b->unsent_why = b->why;
		return false;
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
		if (amqp_msg_build(b->st->cfg, &b->events[i], &s->msg,
				   r->reason, sizeof(r->reason))) {
			/* Only memory can fail a row the relay validated:
			 * let it retry. */
			settle(fl, i,
			       strcmp(r->reason, "out of memory") == 0
				   ? PUB_NOT_WRITTEN
				   : PUB_PERMANENT,
			       false, r->reason);
			return false;
		}
		s->built = true;
	}
	if (amqp_msg_check_fit(&s->msg, b->st->frame_max, b->why,
			       sizeof(b->why)) != 0) {
		settle(fl, i, PUB_PERMANENT, false, b->why);
		return false;
	}
	return true;
}

/* Writes slot i (reopening the channel if the broker closed it). false
 * when the flight must stop writing. */
static bool slot_send(struct batch *b, size_t i)
{
	struct amqp_state *st = b->st;
	struct flight *fl = b->fl;

	if (b->ctx && b->ctx->may_send && !b->ctx->may_send(b->ctx, i)) {
		settle_unsent(fl, i,
			      "not sent: the lease or its deadline no longer "
			      "allows it");
		return true;
	}
	if (fl->slots[i].writes >= MAX_WRITES) {
		settle_unsent(fl, i,
			      "not sent: the broker closed the channel again");
		return true;
	}
	if (!slot_build(b, i))
		return true;
	if (!st->channel_open) {
		cork(st, false);
		if (channel_open(st, b->why, sizeof(b->why)) != 0) {
			b->cursor = i;
			if (!fl->lost) {
				fl->lost = true;
				set_reason(fl->lost_why, sizeof(fl->lost_why),
					   "%s", b->why);
			}
			return false;
		}
		fl->base_tag = fl->low_tag = st->next_tag;
		fl->ntags = 0;
	}
	cork(st, true);
	if (write_slot(st, i) != 0)
		return false;
	if (++b->since_pump < PUMP_EVERY && b->cursor < fl->n)
		return true;
	b->since_pump = 0;
	pump_ready(st);
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
		if (pump_one(b->st, wait > TICK_MS ? TICK_MS : wait) < 0)
			break;
		if (!b->st->channel_open)
			b->cursor = 0;
	}
}

static int amqp_publish(void *state, const struct outbox_event *events,
			size_t n, struct publish_ctx *ctx,
			struct pub_result *results)
{
	struct amqp_state *st = state;
	struct flight fl = {
	    .n = n,
	    .results = results,
	    .mandatory = true,
	    .deadline =
		ctx ? ctx->deadline_ms : clock_ms() + timeout_ms(st->cfg),
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
	cork(st, false);
	rc = flight_finish(st, b.unsent_why);
	st->fl = NULL;
	for (size_t i = 0; i < n; i++)
		amqp_msg_release(&fl.slots[i].msg);
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
static int amqp_probe(void *state, char *err, size_t errlen)
{
	struct amqp_state *st = state;
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
	    .deadline = clock_ms() + timeout_ms(st->cfg),
	    .by_tag = by_tag,
	};
	amqp_basic_properties_t *p = &slot.msg.props;

	if (st->conn)
		pump_ready(st);
	if (st->conn && st->blocked) {
		set_reason(err, errlen,
			   "amqp broker %s: broker blocked the "
			   "connection: %s",
			   st->where, st->blocked_why);
		return -1;
	}
	if (!st->conn && conn_open(st, err, errlen) != 0)
		return -1;
	if (!st->channel_open && channel_open(st, err, errlen) != 0)
		return -1;

	slot.msg.exchange = amqp_cstring_bytes("");
	slot.msg.routing_key = amqp_cstring_bytes(PROBE_ROUTING_KEY);
	slot.msg.body = amqp_empty_bytes;
	p->_flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_EXPIRATION_FLAG |
		    AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_TYPE_FLAG;
	p->delivery_mode = 1;
	p->expiration = amqp_cstring_bytes("0");
	p->app_id = amqp_cstring_bytes(AMQP_MAP_APP_ID);
	p->type = amqp_cstring_bytes(PROBE_ROUTING_KEY);

	st->fl = &fl;
	fl.base_tag = fl.low_tag = st->next_tag;
	if (write_slot(st, 0) == 0) {
		while (fl.unsettled > 0 && !fl.lost && !st->blocked &&
		       clock_ms() < fl.deadline) {
			int64_t wait = fl.deadline - clock_ms();

			if (pump_one(st, wait > TICK_MS ? TICK_MS : wait) < 0)
				break;
		}
	}
	if (fl.unsettled > 0 && st->blocked && !fl.lost) {
		/* Its confirm comes only after the block lifts; this channel
		 * must not deliver it to a later batch. */
		settle(&fl, 0, PUB_TRANSPORT, false, "blocked");
		channel_abandon(st);
		st->fl = NULL;
		set_reason(err, errlen,
			   "amqp broker %s: broker blocked the "
			   "connection: %s",
			   st->where, st->blocked_why);
		return -1;
	}
	flight_finish(st, "probe not sent");
	st->fl = NULL;
	if (result.outcome == PUB_ACKED)
		return 0;
	set_reason(err, errlen, "amqp broker %s: probe publish failed: %s",
		   st->where, result.reason);
	return -1;
}

static void amqp_service(void *state)
{
	struct amqp_state *st = state;

	if (!st || !st->conn)
		return;
	/* Reading is what answers heartbeats in librabbitmq 0.11, and it
	 * picks up connection.blocked/unblocked and connection.close. */
	pump_ready(st);
	if (st->conn && !amqp_frames_enqueued(st->conn))
		amqp_maybe_release_buffers(st->conn);
}

static void amqp_close(void *state)
{
	state_free(state);
}

const struct publisher_ops publisher_amqp = {
    .name = "amqp",
    .settings = &amqp_settings_group,
    .default_destination = amqp_default_destination,
    .validate = amqp_validate,
    .open = amqp_open,
    .publish = amqp_publish,
    .probe = amqp_probe,
    .service = amqp_service,
    .close = amqp_close,
};
