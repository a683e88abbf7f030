/* SPDX-License-Identifier: MIT */
/*
 * The AMQP backend's connection: connecting (TCP or TLS), logging in,
 * the confirm channel, closing, and the watchdog that breaks a socket
 * call stuck past its deadline. Errors name host and vhost, never a
 * secret.
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

/* Formats a reason; a cut never splits a UTF-8 character, since reasons
 * end up in last_error, a text column. */
void rmq_set_reason(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(buf, len, fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n >= len)
		rmq_map_utf8_cut(buf);
}

/* Two missed heartbeats end a silent link: within half the lease timeout,
 * whatever OUTBOX_AMQP_HEARTBEAT says, and never under a second. */
int rmq_heartbeat_s(const struct config *cfg)
{
	int64_t ms = rmq_settings_of(cfg)->heartbeat_ms;
	if (ms > cfg->lease_timeout_ms / 4)
		ms = cfg->lease_timeout_ms / 4;
	return ms >= 1000 ? (int)(ms / 1000) : 1;
}

int64_t rmq_timeout_ms(const struct config *cfg)
{
	return cfg->publish_timeout_ms > 0 ? cfg->publish_timeout_ms : 5000;
}

struct timeval rmq_tv_of(int64_t ms)
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
		ts = clock_monotonic_after(wd->deadline - now);
		wd->wakes_at = wd->deadline;
		pthread_cond_timedwait(&wd->cond, &wd->lock, &ts);
	}
	pthread_mutex_unlock(&wd->lock);
	return NULL;
}

int rmq_watchdog_start(struct watchdog *wd, char *err, size_t errlen)
{
	pthread_condattr_t ca;
	sigset_t all, old;
	int rc;

	wd->fd = -1;
	wd->wakes_at = INT64_MAX;
	if (pthread_condattr_init(&ca) != 0) {
		rmq_set_reason(err, errlen, "amqp: cannot create the watchdog");
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
		rmq_set_reason(err, errlen, "amqp: cannot create the watchdog");
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

		rmq_set_reason(err, errlen,
			       "amqp: cannot start the watchdog: %s",
			       strerror_r(rc, tmp, sizeof(tmp)));
		return -1;
	}
	wd->started = true;
	return 0;
}

void rmq_watchdog_stop(struct watchdog *wd)
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
void rmq_watchdog_arm(struct rmq_state *st, int64_t deadline)
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
bool rmq_watchdog_disarm(struct rmq_state *st)
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

void rmq_describe_status(int status, char *buf, size_t len)
{
	rmq_set_reason(buf, len, "%s", amqp_error_string2(status));
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
		rmq_set_reason(buf, len, "%s", gai_strerror(rc));
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
		rmq_set_reason(buf, len, "%s", strerror_r(e, tmp, sizeof(tmp)));
	if (fd >= 0)
		close(fd);
	freeaddrinfo(res);
}

/* ---- connection ---- */

/* Forgets the connection without a goodbye (it is broken or the broker
 * already closed it). Everything written and unconfirmed is in doubt. */
void rmq_conn_drop(struct rmq_state *st, const char *why)
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
		rmq_set_reason(fl->lost_why, sizeof(fl->lost_why), "%s", why);
	}
}

/* Handles the reply of a failed RPC: answers a connection.close or a
 * channel.close and drops what they closed. */
static void rpc_failed(struct rmq_state *st, amqp_rpc_reply_t r,
		       const char *what, char *err, size_t errlen)
{
	char why[200];

	rmq_map_describe_reply(r, why, sizeof(why));
	rmq_set_reason(err, errlen, "amqp broker %s: %s failed: %s", st->where,
		       what, why);
	if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
	    r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
		amqp_channel_close_ok_t ok = {0};

		rmq_watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS);
		int rc = amqp_send_method(st->conn, st->channel,
					  AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
		rmq_watchdog_disarm(st);
		st->channel_open = false;
		if (rc == AMQP_STATUS_OK)
			return;
	} else if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION &&
		   r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
		amqp_connection_close_ok_t ok = {0};

		rmq_watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS);
		amqp_send_method(st->conn, 0, AMQP_CONNECTION_CLOSE_OK_METHOD,
				 &ok);
		rmq_watchdog_disarm(st);
	}
	/* A library error (timeout included: librabbitmq closes the socket
	 * on an RPC timeout) or a connection.close: the connection is gone. */
	rmq_conn_drop(st, err);
}

/* Opens a fresh channel in confirm mode, waiting for the broker until
 * `until` (clock_ms()) at most. 0, or -1 with err set. */
int rmq_channel_open(struct rmq_state *st, int64_t until, char *err,
		     size_t errlen)
{
	amqp_rpc_reply_t r;
	amqp_channel_t next =
	    (amqp_channel_t)(st->channel % st->channel_max + 1);
	int64_t left = until - clock_ms();
	struct timeval tv;

	if (left <= 0) {
		rmq_set_reason(err, errlen,
			       "amqp broker %s: no time left to open a channel",
			       st->where);
		return -1;
	}
	if (left > rmq_timeout_ms(st->cfg))
		left = rmq_timeout_ms(st->cfg);

	/* The channel closed without waiting may still have acks on the
	 * way, which librabbitmq would hand over as the new channel's: they
	 * would settle its messages unconfirmed. A broker allowing one
	 * channel (or few) comes round to that number at once. */
	if (next == st->closing) {
		rmq_set_reason(err, errlen,
			       "amqp broker %s: no channel to open: the broker "
			       "has not confirmed closing channel %u",
			       st->where, (unsigned)next);
		rmq_conn_drop(st, err);
		return -1;
	}
	st->channel = next;
	/* A publish's deadline bounds the wait: reopened mid-batch, with the
	 * whole publish timeout, a publish ran up to twice its timeout. Each
	 * RPC gets librabbitmq's timeout afresh, so the second gets what the
	 * first left; the watchdog, for a write stuck, fires just after. */
	int64_t end = clock_ms() + left;
	tv = rmq_tv_of(left);
	amqp_set_rpc_timeout(st->conn, &tv);
	rmq_watchdog_arm(st, end + REOPEN_MIN_MS);
	amqp_channel_open(st->conn, st->channel);
	r = amqp_get_rpc_reply(st->conn);
	if (r.reply_type == AMQP_RESPONSE_NORMAL) {
		int64_t rest = end - clock_ms();
		if (rest > 0) {
			tv = rmq_tv_of(rest);
			amqp_set_rpc_timeout(st->conn, &tv);
			amqp_confirm_select(st->conn, st->channel);
			r = amqp_get_rpc_reply(st->conn);
		} else {
			/* Open but not confirming: the connection goes, as
			 * after an RPC that timed out. */
			r.reply_type = AMQP_RESPONSE_LIBRARY_EXCEPTION;
			r.library_error = AMQP_STATUS_TIMEOUT;
		}
	}
	rmq_watchdog_disarm(st);
	if (st->conn) {
		tv = rmq_tv_of(rmq_timeout_ms(st->cfg));
		amqp_set_rpc_timeout(st->conn, &tv);
	}
	if (r.reply_type != AMQP_RESPONSE_NORMAL) {
		rpc_failed(st, r, "opening a channel", err, errlen);
		return -1;
	}
	st->channel_open = true;
	st->next_tag = 1;
	return 0;
}

/* Closes the channel without waiting: its late frames are dropped since
 * the next channel has another number, and that number is not used again
 * before the close is confirmed; a second channel to close before the
 * first is means a broker not answering: the connection goes. */
void rmq_channel_abandon(struct rmq_state *st)
{
	amqp_channel_close_t c = {
	    .reply_code = AMQP_REPLY_SUCCESS,
	    .reply_text = amqp_cstring_bytes("confirm timeout"),
	};
	int rc;

	if (!st->conn || !st->channel_open)
		return;
	st->channel_open = false;
	if (st->closing) {
		rmq_conn_drop(st, "a channel to close while the broker has "
				  "not confirmed closing the last one");
		return;
	}
	st->closing = st->channel;
	rmq_watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS);
	rc = amqp_send_method(st->conn, st->channel, AMQP_CHANNEL_CLOSE_METHOD,
			      &c);
	if (rmq_watchdog_disarm(st) || rc != AMQP_STATUS_OK)
		rmq_conn_drop(st, "closing a channel failed");
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

/* A TLS socket verifying peer and host name (unless
 * OUTBOX_AMQP_TLS_VERIFY=off), trusting OUTBOX_AMQP_TLS_CA or the
 * system's bundle and presenting the client certificate when one is set;
 * or a plain TCP one. */
static amqp_socket_t *socket_new(struct rmq_state *st, char *err, size_t errlen)
{
	const struct rmq_settings *as = rmq_settings_of(st->cfg);
	const char *ca = as->tls_ca_file ? as->tls_ca_file : CA_BUNDLE;
	amqp_socket_t *sock;
	int rc;

	if (!st->ci.ssl) {
		sock = amqp_tcp_socket_new(st->conn);
		if (!sock)
			rmq_set_reason(err, errlen, "amqp: out of memory");
		return sock;
	}
	sock = amqp_ssl_socket_new(st->conn);
	if (!sock) {
		rmq_set_reason(err, errlen,
			       "amqp broker %s: cannot create a TLS socket",
			       st->where);
		return NULL;
	}
	rc = amqp_ssl_socket_set_cacert(sock, ca);
	if (rc != AMQP_STATUS_OK) {
		rmq_set_reason(err, errlen,
			       "amqp broker %s: cannot load the CA file %s: %s",
			       st->where, ca, amqp_error_string2(rc));
		return NULL;
	}
	if (as->tls_cert_file) {
		rc = amqp_ssl_socket_set_key(sock, as->tls_cert_file,
					     as->tls_key_file);
		if (rc != AMQP_STATUS_OK) {
			rmq_set_reason(
			    err, errlen,
			    "amqp broker %s: cannot load the client "
			    "certificate %s with key %s (a PEM pair, key "
			    "unencrypted): %s",
			    st->where, as->tls_cert_file, as->tls_key_file,
			    amqp_error_string2(rc));
			return NULL;
		}
	}
	amqp_ssl_socket_set_verify_peer(sock, as->tls_verify);
	amqp_ssl_socket_set_verify_hostname(sock, as->tls_verify);
	amqp_ssl_socket_set_ssl_versions(sock, AMQP_TLSv1_2, AMQP_TLSvLATEST);
	return sock;
}

/* What a failed TLS connect most likely means, for the operator: the
 * library says only that the handshake or a verification failed. */
static const char *tls_hint(const struct rmq_state *st, int rc)
{
	if (!st->ci.ssl || !rmq_settings_of(st->cfg)->tls_verify)
		return "";
	switch (rc) {
	case AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED:
		return " (the broker's certificate is not issued for the host "
		       "name in OUTBOX_AMQP_URL)";
	case AMQP_STATUS_SSL_PEER_VERIFY_FAILED:
		return " (the broker's certificate is not signed by a CA in "
		       "OUTBOX_AMQP_TLS_CA, or in the system's bundle when "
		       "that "
		       "is unset)";
	case AMQP_STATUS_SSL_CONNECTION_FAILED:
	case AMQP_STATUS_SSL_ERROR:
		return " (does the broker speak TLS on that port, and accept "
		       "the client certificate if one is set?)";
	default:
		return "";
	}
}

static int socket_connect(struct rmq_state *st, amqp_socket_t *sock,
			  struct timeval *tv, char *err, size_t errlen)
{
	int rc = amqp_socket_open_noblock(sock, st->ci.host, st->ci.port, tv);
	char why[160] = "";

	if (rc == AMQP_STATUS_OK)
		return 0;
	if (rc == AMQP_STATUS_SOCKET_ERROR)
		connect_diagnose(st->ci.host, st->ci.port,
				 rmq_timeout_ms(st->cfg), why, sizeof(why));
	if (!why[0])
		rmq_describe_status(rc, why, sizeof(why));
	rmq_set_reason(err, errlen, "amqp broker %s: cannot connect: %s%s",
		       st->where, why, tls_hint(st, rc));
	return -1;
}

static int login(struct rmq_state *st, char *err, size_t errlen)
{
	amqp_table_entry_t caps[2], props[4];
	amqp_table_t client;
	amqp_rpc_reply_t r;
	char why[200];
	bool external = rmq_settings_of(st->cfg)->sasl == RMQ_SASL_EXTERNAL;

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
	int heartbeat_s = rmq_heartbeat_s(st->cfg);
	rmq_watchdog_arm(st, clock_ms() + 2 * rmq_timeout_ms(st->cfg));
	if (external)
		/* The broker takes the user name from the certificate and
		 * RabbitMQ ignores the identity sent; librabbitmq 0.11 cannot
		 * send an empty one, so the URL's user (or a fixed word) goes.
		 */
		r = amqp_login_with_properties(
		    st->conn, st->ci.vhost, 0, FRAME_MAX, heartbeat_s, &client,
		    AMQP_SASL_METHOD_EXTERNAL,
		    st->ci.user && st->ci.user[0] ? st->ci.user
						  : "outbox-relay");
	else
		r = amqp_login_with_properties(
		    st->conn, st->ci.vhost, 0, FRAME_MAX, heartbeat_s, &client,
		    AMQP_SASL_METHOD_PLAIN, st->ci.user, st->ci.password);
	rmq_watchdog_disarm(st);
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 0;
	rmq_map_describe_reply(r, why, sizeof(why));
	if (external)
		rmq_set_reason(err, errlen,
			       "amqp broker %s: login with the client "
			       "certificate (SASL EXTERNAL) failed: %s",
			       st->where, why);
	else
		rmq_set_reason(err, errlen,
			       "amqp broker %s: login as user '%s' failed: %s",
			       st->where, st->ci.user, why);
	return -1;
}

/* OUTBOX_AMQP_DECLARE_EXCHANGE: a durable topic exchange. */
static int exchange_declare(struct rmq_state *st, char *err, size_t errlen)
{
	const char *exchange = rmq_settings_of(st->cfg)->exchange;
	char what[320], quoted[80];
	amqp_rpc_reply_t r;

	rmq_watchdog_arm(st, clock_ms() + 2 * rmq_timeout_ms(st->cfg));
	amqp_exchange_declare(
	    st->conn, st->channel, amqp_cstring_bytes(exchange),
	    amqp_cstring_bytes("topic"), 0, 1, 0, 0, amqp_empty_table);
	r = amqp_get_rpc_reply(st->conn);
	rmq_watchdog_disarm(st);
	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return 0;
	cloudevent_quote(quoted, sizeof(quoted), exchange, strlen(exchange),
			 64);
	rmq_set_reason(what, sizeof(what), "declaring exchange '%s'", quoted);
	rpc_failed(st, r, what, err, errlen);
	return -1;
}

/* Connects, logs in, opens the confirm channel and declares the exchange
 * when configured. 0, or -1 with err naming host and vhost. */
int rmq_conn_open(struct rmq_state *st, char *err, size_t errlen)
{
	struct timeval tv = rmq_tv_of(rmq_timeout_ms(st->cfg));
	amqp_socket_t *sock;

	st->conn = amqp_new_connection();
	if (!st->conn) {
		rmq_set_reason(err, errlen, "amqp: out of memory");
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
	st->closing = 0;
	if (rmq_channel_open(st, clock_ms() + rmq_timeout_ms(st->cfg), err,
			     errlen) != 0)
		goto fail;
	if (rmq_settings_of(st->cfg)->declare_exchange &&
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
void rmq_conn_close(struct rmq_state *st)
{
	struct timeval tv = rmq_tv_of(CLOSE_TIMEOUT_MS);

	if (!st->conn)
		return;
	/* A blocked broker reads nothing, so it would never answer. */
	if (!st->blocked) {
		amqp_set_rpc_timeout(st->conn, &tv);
		rmq_watchdog_arm(st, clock_ms() + CLOSE_TIMEOUT_MS + 500);
		amqp_connection_close(st->conn, AMQP_REPLY_SUCCESS);
		rmq_watchdog_disarm(st);
	}
	amqp_destroy_connection(st->conn);
	st->conn = NULL;
	st->channel_open = false;
}
