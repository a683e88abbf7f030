/* SPDX-License-Identifier: MIT */
/*
 * The Kafka backend: librdkafka's idempotent producer (acks=all), one
 * delivery report per record, records shaped by the CloudEvents Kafka
 * binding (binary content mode, or structured on request). Not
 * transactional: the outbox row, not a Kafka transaction, is the unit of
 * retry.
 *
 * Threading: one state, so one producer, per worker, used by one lane at a
 * time under the lanes' publisher lock (publisher.h). librdkafka's own
 * threads talk to the brokers and queue each delivery report and client
 * error; the callbacks for them (on_delivery, on_error) run only inside
 * rd_kafka_poll() and rd_kafka_flush(), which this file calls only from
 * the publisher_ops (open, publish, probe, service, close), so they run on
 * the thread making that call: the lane that holds the lock, or at the
 * end the thread that closes the publisher once every lane has ended.
 * on_delivery hands a result over by writing
 * it into the caller's results[] while publish() collects that batch
 * (st->collecting, the record's generation and slot), and drops any other
 * report. Only log_cb (on_log, on_validate_log) runs on librdkafka's own
 * threads, and it touches nothing but the logger.
 */
#include "kafka.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "base/base.h"
#include "encode/encode.h"

#define CE_PREFIX "ce_"

/* A record's opaque is (batch generation << SLOT_BITS | index), so the late
 * report of a record an earlier batch gave up on is recognized and
 * ignored. */
#define SLOT_BITS 16
#define SLOT_MASK (((uintptr_t)1 << SLOT_BITS) - 1)
#define GEN_MASK (UINTPTR_MAX >> SLOT_BITS)
#define MAX_BATCH ((size_t)SLOT_MASK)

/* tick() wants a call at least every 200 ms while outcomes are awaited. */
#define TICK_MS 100
/* Upper bound of one reachability check (open, probe). */
#define PROBE_TIMEOUT_MS 5000
/* The same client error is logged at most this often... */
#define ERROR_QUIET_MS 10000
/* ...remembering this many distinct codes. */
#define ERROR_CODES 8

enum slot_state {
	SLOT_OPEN,   /* not handed to librdkafka: results[i] is final */
	SLOT_QUEUED, /* handed over, no delivery report yet */
	SLOT_DONE,   /* delivery report received */
	/* Its report: refused as too large, maybe for its record batch's
	 * size (retry_refused_alone()); results[i] says PUB_PERMANENT. */
	SLOT_TOO_LARGE,
};

struct kafka_state {
	const struct config *cfg; /* borrowed; read-only for the process */
	rd_kafka_t *rk;		  /* NULL after a failed recreate */

	/* The batch whose delivery reports are awaited (publish() only);
	 * reports arriving outside it are ignored. */
	bool collecting;
	uintptr_t gen;
	struct pub_result *results; /* borrowed from the caller */
	unsigned char *slots;	    /* enum slot_state per event; owned */
	size_t slots_cap;
	size_t n;
	size_t queued;		  /* SLOT_QUEUED count */
	bool trouble;		  /* the cluster, not a row, failed */
	const char *purge_reason; /* for the reports of our own purge */

	int64_t depth_reported; /* this state's share of the queue gauge */
	/* When each recent client error code was last logged at warn. */
	struct {
		int err;
		int64_t ms;
	} logged[ERROR_CODES];
};

/* librdkafka's own log lines (any thread). Errors at levels 0-3 also
 * reach error_cb, which logs them once, so here they are debug. */
static void on_log(const rd_kafka_t *rk, int level, const char *fac,
		   const char *buf)
{
	enum log_level lvl = level <= 3	  ? LOG_DEBUG
			     : level == 4 ? LOG_WARN
			     : level == 5 ? LOG_INFO
					  : LOG_DEBUG;

	(void)rk;
	if (log_enabled(lvl))
		log_fields(lvl, buf, "component", "librdkafka", "facility", fac,
			   NULL);
}

/* Only configuration warnings while validating; its notice that the
 * throwaway client has no brokers is expected. */
static void on_validate_log(const rd_kafka_t *rk, int level, const char *fac,
			    const char *buf)
{
	if (level <= 4 && strcmp(fac, "CONFWARN") == 0)
		on_log(rk, level, fac, buf);
}

/* ---- delivery reports ---- */

/* True when err was logged less than ERROR_QUIET_MS ago; else records
 * that it is logged now (replacing the oldest entry). */
static bool error_quiet(struct kafka_state *st, int err, int64_t now)
{
	size_t oldest = 0;

	for (size_t i = 0; i < ERROR_CODES; i++) {
		if (st->logged[i].ms && st->logged[i].err == err) {
			if (now - st->logged[i].ms < ERROR_QUIET_MS)
				return true;
			oldest = i;
			break;
		}
		if (st->logged[i].ms < st->logged[oldest].ms)
			oldest = i;
	}
	st->logged[oldest].err = err;
	st->logged[oldest].ms = now;
	return false;
}

static void on_error(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	struct kafka_state *st = opaque;
	char why[512];
	int64_t now = clock_ms();

	if (err == RD_KAFKA_RESP_ERR__FATAL) {
		rd_kafka_fatal_error(rk, why, sizeof(why));
		log_fields(LOG_ERROR, "kafka producer fatal error", "error",
			   why, NULL);
		return;
	}
	/* An outage repeats the same errors per broker and reconnect. */
	if (st && error_quiet(st, err, now)) {
		log_fields(LOG_DEBUG, "kafka client error", "error", reason,
			   "code", rd_kafka_err2name(err), NULL);
		return;
	}
	log_fields(LOG_WARN, "kafka client error", "error", reason, "code",
		   rd_kafka_err2name(err), NULL);
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m,
			void *opaque)
{
	struct kafka_state *st = opaque;
	uintptr_t tag = (uintptr_t)m->_private;
	size_t i = (size_t)(tag & SLOT_MASK);
	struct pub_result *r;
	char what[320];

	(void)rk;
	if (!st->collecting || (tag >> SLOT_BITS) != (st->gen & GEN_MASK) ||
	    i >= st->n || st->slots[i] != SLOT_QUEUED)
		return; /* a record an earlier batch already gave up on */
	st->slots[i] = SLOT_DONE;
	st->queued--;
	r = &st->results[i];
	r->route_scoped = false;
	if (!m->err) {
		r->outcome = PUB_ACKED;
		r->reason[0] = '\0';
		return;
	}
	r->outcome = kafka_delivery_outcome(m->err, rd_kafka_message_status(m));
	if (m->err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
	    m->err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE)
		st->slots[i] = SLOT_TOO_LARGE;
	if (m->err == RD_KAFKA_RESP_ERR__PURGE_QUEUE && st->purge_reason) {
		if (r->outcome == PUB_NOT_WRITTEN) {
			kafka_ascii_copy(r->reason, sizeof(r->reason),
					 st->purge_reason);
			return;
		}
		snprintf(what, sizeof(what),
			 "%s, but an earlier send of it may have reached the "
			 "broker",
			 st->purge_reason);
		kafka_ascii_copy(r->reason, sizeof(r->reason), what);
		st->trouble = true;
		return;
	}
	snprintf(what, sizeof(what), "delivery to topic '%s' failed",
		 m->rkt ? rd_kafka_topic_name(m->rkt) : "?");
	kafka_reason(r->reason, sizeof(r->reason), what, m->err);
	if (r->outcome == PUB_TRANSPORT || r->outcome == PUB_NOT_WRITTEN)
		st->trouble = true;
}

/* Serves every report already waiting, without blocking. */
static void drain(rd_kafka_t *rk)
{
	/* Bounded: a busy client could keep producing events. */
	for (int i = 0; i < 1000 && rd_kafka_poll(rk, 0) > 0; i++)
		;
}

/* Purges records not yet sent and serves their reports (ERR__PURGE_QUEUE,
 * with the status they earned: NOT_PERSISTED unless an earlier send of
 * the same record may have reached the broker). */
static void purge_unsent(struct kafka_state *st, const char *why)
{
	st->purge_reason = why;
	rd_kafka_purge(st->rk, RD_KAFKA_PURGE_F_QUEUE);
	drain(st->rk);
	st->purge_reason = NULL;
}

static void depth_update(struct kafka_state *st)
{
	int64_t depth = st->rk ? rd_kafka_outq_len(st->rk) : 0;

	/* Each worker's producer adds its own share to the one gauge. */
	metrics_gauge_add(MG_KAFKA_QUEUE_DEPTH, depth - st->depth_reported);
	st->depth_reported = depth;
}

/* ---- the producer ---- */

static int producer_create(struct kafka_state *st, char *err, size_t errlen)
{
	char why[512] = "";
	rd_kafka_conf_t *conf = kafka_conf_build(st->cfg, true, err, errlen);

	if (!conf)
		return -1;
	rd_kafka_conf_set_opaque(conf, st);
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rd_kafka_conf_set_error_cb(conf, on_error);
	rd_kafka_conf_set_log_cb(conf, on_log);
	st->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof(why));
	if (!st->rk) {
		rd_kafka_conf_destroy(conf);
		snprintf(err, errlen, "cannot create the Kafka producer: %s",
			 why);
		return -1;
	}
	return 0;
}

/* Drops the producer with everything in it. Records without a report
 * keep whatever outcome the caller already gave them. */
static void producer_destroy(struct kafka_state *st)
{
	bool collecting = st->collecting;

	if (!st->rk)
		return;
	st->collecting = false;
	rd_kafka_purge(st->rk,
		       RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	drain(st->rk);
	rd_kafka_destroy(st->rk);
	st->rk = NULL;
	st->collecting = collecting;
	depth_update(st);
}

/* After a fatal error (idempotence: the producer cannot go on) a new
 * producer with a new producer id replaces the old one. */
static int producer_recover(struct kafka_state *st, char *err, size_t errlen)
{
	char why[512] = "";

	if (st->rk) {
		if (rd_kafka_fatal_error(st->rk, why, sizeof(why)) ==
		    RD_KAFKA_RESP_ERR_NO_ERROR)
			return 0;
		log_fields(LOG_WARN,
			   "recreating the kafka producer after a "
			   "fatal error",
			   "error", why, NULL);
		producer_destroy(st);
	}
	return producer_create(st, err, errlen);
}

/* A real round trip: a Metadata request answered by a broker. */
static int cluster_check(struct kafka_state *st, char *err, size_t errlen)
{
	const struct rd_kafka_metadata *md = NULL;
	int timeout = (int)(st->cfg->publish_timeout_ms < PROBE_TIMEOUT_MS
				? st->cfg->publish_timeout_ms
				: PROBE_TIMEOUT_MS);
	rd_kafka_resp_err_t rerr;
	int ret = -1;

	/* Locally known topics only: a probe must not auto-create one. */
	rerr = rd_kafka_metadata(st->rk, 0, NULL, &md, timeout);
	if (rerr) {
		char what[600];

		snprintf(what, sizeof(what),
			 "Kafka brokers %s did not answer a metadata request",
			 kafka_settings_of(st->cfg)->brokers);
		kafka_reason(err, errlen, what, rerr);
		goto out;
	}
	if (md->broker_cnt < 1) {
		snprintf(err, errlen, "Kafka brokers %s list no brokers",
			 kafka_settings_of(st->cfg)->brokers);
		goto out;
	}
	ret = 0;
out:
	if (md)
		rd_kafka_metadata_destroy(md);
	return ret;
}

/* ---- publish ---- */

static void result_set(struct pub_result *r, enum pub_outcome outcome,
		       const char *reason)
{
	r->outcome = outcome;
	r->route_scoped = false;
	kafka_ascii_copy(r->reason, sizeof(r->reason), reason);
}

struct run {
	struct kafka_state *st;
	struct publish_ctx *ctx;
	int64_t deadline_ms;
	int64_t last_tick_ms;
	bool stopping; /* tick() said shutdown began: send nothing more */
};

/* Lets the relay renew the lease; at shutdown, unsent records go back. */
static void run_tick(struct run *run)
{
	int64_t now = clock_ms();

	if (now - run->last_tick_ms < TICK_MS)
		return;
	run->last_tick_ms = now;
	if (!run->ctx || !run->ctx->tick || !run->ctx->tick(run->ctx) ||
	    run->stopping)
		return;
	run->stopping = true;
	if (run->st->queued > 0)
		purge_unsent(run->st, "purged before it was sent: the relay "
				      "is shutting down");
}

static void produce_one(struct run *run, const struct outbox_event *ev,
			size_t i)
{
	struct kafka_state *st = run->st;
	struct pub_result *r = &st->results[i];
	struct kafka_msg msg;
	enum pub_outcome fail;
	rd_kafka_resp_err_t rerr;
	uintptr_t tag = ((st->gen & GEN_MASK) << SLOT_BITS) | (uintptr_t)i;

	if (kafka_msg_build(st->cfg, ev, &msg, &fail, r->reason,
			    sizeof(r->reason)) != 0) {
		r->outcome = fail;
		r->route_scoped = false;
		return;
	}
	for (;;) {
		int64_t left;

		rerr = rd_kafka_producev(
		    st->rk, RD_KAFKA_V_TOPIC(msg.topic),
		    RD_KAFKA_V_KEY(msg.key, msg.key_len),
		    RD_KAFKA_V_VALUE((void *)msg.value, msg.value_len),
		    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
		    RD_KAFKA_V_HEADERS(msg.headers),
		    RD_KAFKA_V_OPAQUE((void *)tag), RD_KAFKA_V_END);
		if (rerr != RD_KAFKA_RESP_ERR__QUEUE_FULL)
			break;
		/* Serving reports makes room. */
		left = run->deadline_ms - clock_ms();
		if (left <= 0 || run->stopping)
			break;
		rd_kafka_poll(st->rk,
			      (int)(left < TICK_MS / 2 ? left : TICK_MS / 2));
		run_tick(run);
	}
	if (rerr == RD_KAFKA_RESP_ERR_NO_ERROR) {
		msg.headers = NULL; /* librdkafka's now */
		st->slots[i] = SLOT_QUEUED;
		st->queued++;
	} else {
		char what[320];

		r->outcome = kafka_produce_outcome(rerr);
		r->route_scoped = false;
		snprintf(what, sizeof(what),
			 "not handed to the broker: producing to topic '%s' "
			 "failed",
			 msg.topic);
		kafka_reason(r->reason, sizeof(r->reason), what, rerr);
		if (rerr == RD_KAFKA_RESP_ERR__QUEUE_FULL ||
		    rerr == RD_KAFKA_RESP_ERR__FATAL)
			st->trouble = true;
	}
	kafka_msg_release(&msg);
}

/* Every record still without a report gets reason as a PUB_TRANSPORT. */
static void queued_to_transport(struct kafka_state *st, const char *reason)
{
	for (size_t i = 0; i < st->n; i++) {
		if (st->slots[i] != SLOT_QUEUED)
			continue;
		st->slots[i] = SLOT_DONE;
		result_set(&st->results[i], PUB_TRANSPORT, reason);
	}
	st->queued = 0;
	st->trouble = true;
}

static void await_reports(struct run *run)
{
	struct kafka_state *st = run->st;
	char why[256];
	char reason[300];
	char err[512];

	while (st->queued > 0) {
		int64_t left = run->deadline_ms - clock_ms();

		if (rd_kafka_fatal_error(st->rk, why, sizeof(why))) {
			/* Nothing more will be confirmed by this producer. */
			snprintf(reason, sizeof(reason),
				 "kafka producer fatal error, outcome "
				 "unknown: %s",
				 why);
			queued_to_transport(st, reason);
			if (producer_recover(st, err, sizeof(err)) != 0)
				log_fields(LOG_ERROR,
					   "cannot recreate the kafka producer",
					   "error", err, NULL);
			return;
		}
		if (left <= 0)
			break;
		/* flush, not poll: it serves the delivery reports as poll
		 * does, and while it waits librdkafka sends what is queued at
		 * once instead of lingering (linger.ms, 5 ms by default): the
		 * whole batch is queued, and nothing more will join it. This
		 * worker's producer carries only this batch. */
		rd_kafka_flush(st->rk, (int)(left < TICK_MS ? left : TICK_MS));
		run_tick(run);
	}
	if (st->queued == 0)
		return;
	/* Deadline: what never left the producer is given back; what is in
	 * flight may still be written, so it keeps its charge. */
	purge_unsent(st, "not sent before the publish deadline (brokers "
			 "unreachable or slow); purged from the producer");
	st->trouble = true;
	queued_to_transport(st, "in flight without a delivery report at the "
				"publish deadline; outcome unknown");
}

/*
 * A broker holds a topic's max.message.bytes against a whole record batch,
 * and librdkafka 2.0.2 does not split a batch it refused: every record in
 * it is reported too large, the small ones too. When more than one record
 * was, each goes again alone (its own batch, as the producer carries
 * nothing else), and only a record refused alone fails for its size.
 */
static void retry_refused_alone(struct run *run,
				const struct outbox_event *events, size_t n)
{
	struct kafka_state *st = run->st;
	size_t refused = 0;

	for (size_t i = 0; i < n; i++)
		refused += st->slots[i] == SLOT_TOO_LARGE;
	if (refused < 2)
		return;
	for (size_t i = 0; i < n; i++) {
		const char *why = NULL;

		if (st->slots[i] != SLOT_TOO_LARGE)
			continue;
		if (run->stopping)
			why = "the relay is shutting down";
		else if (!st->rk)
			/* A fatal error's recreate failed (await_reports()). */
			why = "the kafka producer could not be recreated";
		else if (clock_ms() >= run->deadline_ms)
			why = "the publish deadline passed";
		else if (run->ctx && run->ctx->may_send &&
			 !run->ctx->may_send(run->ctx, i))
			why = "the lease no longer allows it";
		if (why) {
			char reason[300];

			/* The broker wrote none of it: given back, to go
			 * again (alone, if refused again) next time. */
			snprintf(reason, sizeof(reason),
				 "refused with its record batch as too large, "
				 "not sent again alone: %s",
				 why);
			result_set(&st->results[i], PUB_NOT_WRITTEN, reason);
			continue;
		}
		st->slots[i] = SLOT_OPEN;
		produce_one(run, &events[i], i);
		await_reports(run);
	}
}

static int slots_reserve(struct kafka_state *st, size_t n)
{
	unsigned char *grown;

	if (n <= st->slots_cap)
		return 0;
	grown = realloc(st->slots, n);
	if (!grown)
		return -1;
	st->slots = grown;
	st->slots_cap = n;
	return 0;
}

static int kafka_publish(void *state, const struct outbox_event *events,
			 size_t n, struct publish_ctx *ctx,
			 struct pub_result *results)
{
	struct kafka_state *st = state;
	struct run run = {
	    .st = st,
	    .ctx = ctx,
	    .deadline_ms = ctx ? ctx->deadline_ms
			       : clock_ms() + st->cfg->publish_timeout_ms,
	    .last_tick_ms = clock_ms(),
	};
	char err[512];

	for (size_t i = 0; i < n; i++)
		result_set(&results[i], PUB_NOT_WRITTEN,
			   "not handed to the broker");
	if (n == 0)
		return 0;
	if (producer_recover(st, err, sizeof(err)) != 0) {
		for (size_t i = 0; i < n; i++)
			result_set(&results[i], PUB_NOT_WRITTEN, err);
		return -1;
	}
	if (slots_reserve(st, n) != 0) {
		for (size_t i = 0; i < n; i++)
			result_set(&results[i], PUB_NOT_WRITTEN,
				   "out of memory");
		return 0;
	}
	memset(st->slots, SLOT_OPEN, n);
	st->gen++;
	st->results = results;
	st->n = n;
	st->queued = 0;
	st->trouble = false;
	st->collecting = true;

	for (size_t i = 0; i < n && i < MAX_BATCH; i++) {
		run_tick(&run);
		if (run.stopping ||
		    (ctx && ctx->may_send && !ctx->may_send(ctx, i)))
			continue;
		if (clock_ms() >= run.deadline_ms) {
			/* Only a full producer queue takes this long. */
			result_set(&results[i], PUB_NOT_WRITTEN,
				   "not handed to the broker before the "
				   "publish deadline");
			continue;
		}
		produce_one(&run, &events[i], i);
	}
	await_reports(&run);
	retry_refused_alone(&run, events, n);

	st->collecting = false;
	st->results = NULL;
	st->n = 0;
	depth_update(st);
	return st->trouble ? -1 : 0;
}

/* ---- the backend ---- */

static int kafka_validate(const struct config *cfg, char *err, size_t errlen)
{
	char why[512] = "";
	rd_kafka_conf_t *conf;
	rd_kafka_t *rk;

	if (!kafka_topic_valid(kafka_settings_of(cfg)->topic)) {
		snprintf(err, errlen,
			 "OUTBOX_KAFKA_TOPIC: not a valid Kafka topic name");
		return -1;
	}
	/* A throwaway client without brokers: rd_kafka_new() checks what
	 * single properties cannot (settings that contradict idempotence,
	 * TLS files) and connects nowhere. */
	conf = kafka_conf_build(cfg, false, err, errlen);
	if (!conf)
		return -1;
	rd_kafka_conf_set_log_cb(conf, on_validate_log);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof(why));
	if (!rk) {
		rd_kafka_conf_destroy(conf);
		snprintf(err, errlen,
			 "OUTBOX_KAFKA_*: librdkafka refuses the producer "
			 "settings: %s",
			 why);
		return -1;
	}
	rd_kafka_destroy(rk);
	return 0;
}

static void kafka_close(void *state)
{
	struct kafka_state *st = state;

	if (!st)
		return;
	/* Nothing queued here may go out after the relay releases rows. */
	producer_destroy(st);
	depth_update(st);
	free(st->slots);
	free(st);
}

static int kafka_open(const struct config *cfg, void **state, char *err,
		      size_t errlen)
{
	struct kafka_state *st = calloc(1, sizeof(*st));

	if (!st) {
		snprintf(err, errlen, "kafka publisher: out of memory");
		return -1;
	}
	st->cfg = cfg;
	if (producer_create(st, err, errlen) != 0 ||
	    cluster_check(st, err, errlen) != 0) {
		kafka_close(st);
		return -1;
	}
	*state = st;
	return 0;
}

static int kafka_probe(void *state, char *err, size_t errlen)
{
	struct kafka_state *st = state;

	if (producer_recover(st, err, errlen) != 0)
		return -1;
	return cluster_check(st, err, errlen);
}

static void kafka_service(void *state)
{
	struct kafka_state *st = state;
	char err[512];

	if (!st->rk)
		return;
	rd_kafka_poll(st->rk, 0);
	if (producer_recover(st, err, sizeof(err)) != 0)
		log_fields(LOG_ERROR, "cannot recreate the kafka producer",
			   "error", err, NULL);
	depth_update(st);
}

rd_kafka_t *kafka_handle(void *state)
{
	return ((struct kafka_state *)state)->rk;
}

const struct publisher_ops publisher_kafka = {
    .name = "kafka",
    .settings = &kafka_settings_group,
    .default_destination = kafka_default_destination,
    .validate = kafka_validate,
    .warn_links = kafka_settings_warn,
    .open = kafka_open,
    .publish = kafka_publish,
    .probe = kafka_probe,
    .service = kafka_service,
    .close = kafka_close,
};
