/* SPDX-License-Identifier: MIT */
/*
 * Inside the AMQP backend: the publisher state (one per worker, used by one
 * lane at a time; publisher.h) and the flight of one
 * publish() shared by its three files: amqp_conn.c (connection, channel,
 * watchdog), amqp_frames.c (what the broker sends back: confirms,
 * returns, channel and connection closes, blocks) and amqp.c (writing a
 * batch, the probe and the publisher_ops).
 */
#ifndef OUTBOX_AMQP_CONN_H
#define OUTBOX_AMQP_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <sys/time.h>

#include <amqp.h>
#include <amqp_framing.h>

#include "amqp_map.h"
#include "base/base.h"
#include "backends.h"

#ifndef OUTBOX_VERSION
#define OUTBOX_VERSION "unknown"
#endif

/* Debian's bundle of the system's trusted CAs: amqps:// verifies the
 * broker's certificate and host name against it unless
 * OUTBOX_AMQP_TLS_CA names another. */
#define CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"
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
/* The least time left before a publish's deadline for a channel to be
 * reopened mid-batch: an answer that comes too late costs the connection
 * (librabbitmq closes the socket on an RPC timeout). */
#define REOPEN_MIN_MS 250

/* Breaks a socket call stuck past its deadline: librabbitmq 0.11 writes
 * with an infinite timeout, so a broker that stops reading (a resource
 * alarm, a black-holed peer) would hang the lane holding the publisher,
 * and the worker's other lanes waiting for it. Shutting the socket down
 * makes the stuck call fail.
 *
 * Threading: one watchdog thread per state, started at open and joined at
 * close. It reads and writes only the fields marked "under lock", and
 * touches the armed socket only to shut it down; the lane making a call
 * on the state arms it around each socket call and disarms it after. */
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
	struct rmq_msg msg;
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

struct rmq_state {
	const struct config *cfg;
	char *url;	/* private copy: amqp_parse_url() points ci into it */
	size_t url_len; /* its length before the parse cut it */
	struct amqp_connection_info ci;
	char where[200]; /* "host:port, vhost '/'" for messages */
	char conn_name[160];
	amqp_connection_state_t conn; /* NULL while disconnected */
	amqp_channel_t channel;	      /* current channel number */
	bool channel_open;	      /* open and in confirm mode */
	/* A channel the relay closed whose close-ok has not come: its number
	 * is not opened again until it has (0: none). */
	amqp_channel_t closing;
	uint16_t channel_max;
	uint64_t next_tag; /* delivery tag of the next publish on channel */
	size_t frame_max;
	bool blocked; /* connection.blocked until connection.unblocked */
	char blocked_why[128];
	struct flight *fl; /* the flight being awaited, or NULL */
	bool corked;	   /* TCP_CORK set on the connection's socket */
	struct watchdog wd;
};

/* Shared between the backend's files (rmq_: RabbitMQ, clear of
 * librabbitmq's amqp_ names). */

/* Formats a reason; a cut never splits a UTF-8 character, since reasons
 * end up in last_error, a text column. */
void rmq_set_reason(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

int64_t rmq_timeout_ms(const struct config *cfg);
int rmq_heartbeat_s(const struct config *cfg);
struct timeval rmq_tv_of(int64_t ms);
int rmq_watchdog_start(struct watchdog *wd, char *err, size_t errlen);
void rmq_watchdog_stop(struct watchdog *wd);
void rmq_watchdog_arm(struct rmq_state *st, int64_t deadline);
bool rmq_watchdog_disarm(struct rmq_state *st);
void rmq_describe_status(int status, char *buf, size_t len);
void rmq_conn_drop(struct rmq_state *st, const char *why);
int rmq_channel_open(struct rmq_state *st, int64_t until, char *err,
		     size_t errlen);
void rmq_channel_abandon(struct rmq_state *st);
int rmq_conn_open(struct rmq_state *st, char *err, size_t errlen);
void rmq_conn_close(struct rmq_state *st);
/* What a destination refusal covers (struct pub_result.route_scoped). */
enum rmq_scope {
	RMQ_SCOPE_DESTINATION, /* the exchange, or not a refusal at all */
	RMQ_SCOPE_ROUTE,       /* only this routing key (unroutable) */
};
void rmq_settle(struct flight *fl, size_t i, enum pub_outcome outcome,
		enum rmq_scope scope, const char *reason);
void rmq_settle_unsent(struct flight *fl, size_t i, const char *why);
void rmq_cork(struct rmq_state *st, bool on);
int rmq_pump_one(struct rmq_state *st, int64_t ms);
void rmq_pump_ready(struct rmq_state *st);

#endif
