/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the Kafka backend's publish loop against librdkafka's
 * in-process mock cluster (test.mock.num.brokers): outcomes per record,
 * injected broker errors, brokers down, the deadline purge, shutdown, a
 * fatal producer error, the queue-full retry and the queue depth gauge.
 * Each test opens its own publisher, so each gets a fresh mock cluster.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "publishers/backends.h"
#include "base/base.h"
#include "publishers/kafka.h"

#define MAXEV 64
#define API_PRODUCE 0

static const unsigned char body[] = "{\"n\":1}";
static char ids[MAXEV][40];
static char big[4096];

struct fixture {
	struct config cfg;
	struct kafka_settings settings;
	struct kafka_prop props[4];
	void *pub;
	struct outbox_event ev[MAXEV];
	struct pub_result res[MAXEV];
};

/* What the relay lends publish(), scripted per test. */
struct tctx {
	struct publish_ctx ctx;
	bool deny_odd;	   /* may_send says no for odd indexes */
	int sends_allowed; /* > 0: may_send says no after this many calls */
	int sends_asked;
	int stop_at_tick; /* tick() reports shutdown from this call on */
	int fatal_at_tick;
	int ticks;
	int64_t max_gap_ms; /* longest time between two tick() calls */
	int64_t last_ms;
	void *pub;
};

static bool t_may_send(struct publish_ctx *ctx, size_t i)
{
	struct tctx *t = (struct tctx *)ctx;
	if (t->sends_allowed && ++t->sends_asked > t->sends_allowed)
		return false;
	return !(t->deny_odd && i % 2 == 1);
}

static bool t_tick(struct publish_ctx *ctx)
{
	struct tctx *t = (struct tctx *)ctx;
	int64_t now = clock_ms();

	if (t->last_ms && now - t->last_ms > t->max_gap_ms)
		t->max_gap_ms = now - t->last_ms;
	t->last_ms = now;
	t->ticks++;
	if (t->fatal_at_tick && t->ticks == t->fatal_at_tick)
		rd_kafka_test_fatal_error(
		    kafka_handle(t->pub),
		    RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
		    "injected by the test");
	return t->stop_at_tick && t->ticks >= t->stop_at_tick;
}

static struct tctx tctx_new(void *pub, int64_t budget_ms)
{
	struct tctx t = {
	    .ctx = {.deadline_ms = clock_ms() + budget_ms,
		    .may_send = t_may_send,
		    .tick = t_tick},
	    .pub = pub,
	};
	t.last_ms = clock_ms();
	return t;
}

/* The publish ended: the time since its last tick counts as a gap too, so
 * that a publish that never ticked shows its whole budget. */
static void tctx_end(struct tctx *t)
{
	int64_t gap = clock_ms() - t->last_ms;
	if (gap > t->max_gap_ms)
		t->max_gap_ms = gap;
}

static void fixture_init(struct fixture *f, int64_t publish_timeout_ms,
			 const char *extra_name, const char *extra_value)
{
	char err[512] = "";
	size_t np = 0;

	memset(f, 0, sizeof(*f));
	f->props[np++] = (struct kafka_prop){(char *)"test.mock.num.brokers",
					     (char *)"3", false};
	if (extra_name)
		f->props[np++] = (struct kafka_prop){
		    (char *)extra_name, (char *)extra_value, false};
	f->settings = (struct kafka_settings){
	    .brokers = (char *)"127.0.0.1:1",
	    .topic = (char *)"t1",
	    .props = f->props,
	    .n_props = np,
	};
	f->cfg = (struct config){
	    .publisher = (char *)"kafka",
	    .parts = {{&kafka_settings_group, &f->settings}},
	    .n_parts = 1,
	    .publish_timeout_ms = publish_timeout_ms,
	    .lease_timeout_ms = 60000,
	};
	for (size_t i = 0; i < MAXEV; i++) {
		snprintf(ids[i], sizeof(ids[i]),
			 "0190a1b2-0000-7000-8000-%012zu", i);
		f->ev[i] = (struct outbox_event){
		    .id = ids[i],
		    .seq = (int64_t)i + 1,
		    .type = "com.example.test.v1",
		    .source = "urn:test",
		    .content_type = "application/json",
		    .routing_key = "",
		    .partition_key = i % 3 == 0	  ? NULL
				     : i % 3 == 1 ? "k1"
						  : "k2",
		    .payload = body,
		    .payload_len = sizeof(body) - 1,
		    .headers_json = "{}",
		    .time = "2024-05-01T00:00:00.000000Z",
		    .attempts = 1,
		    .max_attempts = 10,
		};
	}
	assert_int_equal(publisher_kafka.validate(&f->cfg, err, sizeof(err)),
			 0);
	if (publisher_kafka.open(&f->cfg, &f->pub, err, sizeof(err)) != 0)
		fail_msg("open failed: %s", err);
}

static void fixture_done(struct fixture *f)
{
	publisher_kafka.close(f->pub);
	assert_int_equal(metrics_gauge(MG_KAFKA_QUEUE_DEPTH), 0);
}

static rd_kafka_mock_cluster_t *cluster(struct fixture *f)
{
	rd_kafka_mock_cluster_t *mc =
	    rd_kafka_handle_mock_cluster(kafka_handle(f->pub));
	assert_non_null(mc);
	return mc;
}

static void brokers_set(struct fixture *f, bool up)
{
	for (int32_t id = 1; id <= 3; id++)
		assert_int_equal(
		    up ? rd_kafka_mock_broker_set_up(cluster(f), id)
		       : rd_kafka_mock_broker_set_down(cluster(f), id),
		    0);
}

static int publish(struct fixture *f, size_t n, struct tctx *t)
{
	return publisher_kafka.publish(f->pub, f->ev, n, &t->ctx, f->res);
}

static void expect_all(struct fixture *f, size_t n, enum pub_outcome want)
{
	for (size_t i = 0; i < n; i++)
		if (f->res[i].outcome != want)
			fail_msg("event %zu: outcome %d (%s), want %d", i,
				 (int)f->res[i].outcome, f->res[i].reason,
				 (int)want);
}

/* Publishes until a batch is all acked (the mock may need a moment after
 * brokers come back); fails after budget_ms. */
static void publish_until_acked(struct fixture *f, size_t n, int64_t budget_ms)
{
	int64_t end = clock_ms() + budget_ms;
	char err[512];

	for (;;) {
		struct tctx t = tctx_new(f->pub, 3000);
		bool all = true;

		if (publisher_kafka.probe(f->pub, err, sizeof(err)) == 0 &&
		    publish(f, n, &t) == 0) {
			for (size_t i = 0; i < n; i++)
				all = all && f->res[i].outcome == PUB_ACKED;
			if (all)
				return;
		}
		if (clock_ms() > end)
			fail_msg("not all acked within %lld ms: %s",
				 (long long)budget_ms, f->res[0].reason);
		clock_sleep_ms(200);
	}
}

static void test_acked(void **unused)
{
	struct fixture f;
	struct tctx t;

	(void)unused;
	fixture_init(&f, 5000, NULL, NULL);
	t = tctx_new(f.pub, 5000);
	assert_int_equal(publish(&f, 30, &t), 0);
	expect_all(&f, 30, PUB_ACKED);
	assert_string_equal(f.res[0].reason, "");
	/* Every record is reported: nothing left in the producer. */
	assert_int_equal(rd_kafka_outq_len(kafka_handle(f.pub)), 0);
	assert_int_equal(metrics_gauge(MG_KAFKA_QUEUE_DEPTH), 0);
	/* An empty batch is fine too. */
	assert_int_equal(publish(&f, 0, &t), 0);
	fixture_done(&f);
}

static void expect_conf(struct fixture *f, const char *name, const char *want)
{
	char got[64];
	size_t size = sizeof(got);

	assert_int_equal(rd_kafka_conf_get(rd_kafka_conf(kafka_handle(f->pub)),
					   name, got, &size),
			 RD_KAFKA_CONF_OK);
	if (strcmp(got, want) != 0)
		fail_msg("%s = %s, want %s", name, got, want);
}

/* A silent broker is given up within a quarter of the lease (60 s here),
 * not librdkafka's minute; a property the operator set is left alone. */
static void test_dead_peer_defaults(void **unused)
{
	struct fixture f;

	(void)unused;
	fixture_init(&f, 5000, NULL, NULL);
	assert_int_equal(kafka_dead_peer_ms(&f.cfg), 15000);
	expect_conf(&f, "socket.timeout.ms", "15000");
	expect_conf(&f, "socket.connection.setup.timeout.ms", "15000");
	expect_conf(&f, "reconnect.backoff.max.ms", "7500");
	expect_conf(&f, "socket.keepalive.enable", "true");
	fixture_done(&f);

	fixture_init(&f, 5000, "socket.timeout.ms", "42000");
	expect_conf(&f, "socket.timeout.ms", "42000");
	expect_conf(&f, "socket.connection.setup.timeout.ms", "15000");
	fixture_done(&f);

	/* Bounded both ways. */
	f.cfg.lease_timeout_ms = 2000;
	assert_int_equal(kafka_dead_peer_ms(&f.cfg), KAFKA_DEAD_PEER_MIN_MS);
	f.cfg.lease_timeout_ms = 3600000;
	assert_int_equal(kafka_dead_peer_ms(&f.cfg), KAFKA_DEAD_PEER_MAX_MS);
}

/* A queued batch goes out at once: nothing more will join it, so the
 * producer's linger (here 5 s) must not hold it back. */
static void test_batch_not_lingered(void **unused)
{
	struct fixture f;
	struct tctx t;
	int64_t t0;

	(void)unused;
	fixture_init(&f, 10000, "linger.ms", "5000");
	t = tctx_new(f.pub, 10000);
	t0 = clock_ms();
	assert_int_equal(publish(&f, 20, &t), 0);
	expect_all(&f, 20, PUB_ACKED);
	if (clock_ms() - t0 >= 2500)
		fail_msg("a batch waited %lld ms for the producer's linger",
			 (long long)(clock_ms() - t0));
	fixture_done(&f);
}

static void test_may_send(void **unused)
{
	struct fixture f;
	struct tctx t;

	(void)unused;
	fixture_init(&f, 5000, NULL, NULL);
	t = tctx_new(f.pub, 5000);
	t.deny_odd = true;
	assert_int_equal(publish(&f, 10, &t), 0);
	for (size_t i = 0; i < 10; i++)
		assert_int_equal(f.res[i].outcome,
				 i % 2 ? PUB_NOT_WRITTEN : PUB_ACKED);
	assert_string_equal(f.res[1].reason, "not handed to the broker");
	fixture_done(&f);
}

static void test_retryable_errors(void **unused)
{
	struct fixture f;
	struct tctx t;

	(void)unused;
	fixture_init(&f, 5000, NULL, NULL);
	/* librdkafka retries these itself; none may reach the rows. */
	rd_kafka_mock_push_request_errors(
	    cluster(&f), API_PRODUCE, 4,
	    RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
	    RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
	    RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
	    RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE);
	t = tctx_new(f.pub, 5000);
	assert_int_equal(publish(&f, 12, &t), 0);
	expect_all(&f, 12, PUB_ACKED);
	fixture_done(&f);
}

static void test_broker_refuses_size(void **unused)
{
	struct fixture f;
	struct tctx t;

	(void)unused;
	fixture_init(&f, 5000, NULL, NULL);
	rd_kafka_mock_push_request_errors(cluster(&f), API_PRODUCE, 1,
					  RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
	t = tctx_new(f.pub, 5000);
	assert_int_equal(publish(&f, 1, &t), 0);
	assert_int_equal(f.res[0].outcome, PUB_PERMANENT);
	assert_non_null(strstr(f.res[0].reason, "MSG_SIZE_TOO_LARGE"));
	assert_non_null(strstr(f.res[0].reason, "topic 't1'"));
	/* The producer goes on. */
	publish_until_acked(&f, 5, 10000);
	fixture_done(&f);
}

/* n records of one key held back by a long linger until the flush, so
 * that they go as one partition's batch in one request, which the broker
 * refuses as too large. */
static void batch_to_be_refused(struct fixture *f, size_t n)
{
	fixture_init(f, 10000, "linger.ms", "5000");
	for (size_t i = 0; i < n; i++)
		f->ev[i].partition_key = "k1";
	rd_kafka_mock_push_request_errors(cluster(f), API_PRODUCE, 1,
					  RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
}

/* The broker refuses a whole record batch as too large (a topic's
 * max.message.bytes below what the producer batched): every record of it
 * is reported so, and each goes again alone, where they all pass. Failing
 * them all failed rows that fit. */
static void test_batch_refused_as_too_large(void **unused)
{
	struct fixture f;
	struct tctx t;

	(void)unused;
	batch_to_be_refused(&f, 6);
	t = tctx_new(f.pub, 10000);
	assert_int_equal(publish(&f, 6, &t), 0);
	for (size_t i = 0; i < 6; i++)
		if (f.res[i].outcome != PUB_ACKED)
			fail_msg("record %zu: outcome %d, %s", i,
				 (int)f.res[i].outcome, f.res[i].reason);
	/* Refused again alone: that one fails, for its own size. */
	rd_kafka_mock_push_request_errors(cluster(&f), API_PRODUCE, 2,
					  RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
					  RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
	t = tctx_new(f.pub, 10000);
	assert_int_equal(publish(&f, 2, &t), 0);
	assert_int_equal(f.res[0].outcome, PUB_PERMANENT);
	assert_non_null(strstr(f.res[0].reason, "MSG_SIZE_TOO_LARGE"));
	assert_int_equal(f.res[1].outcome, PUB_ACKED);
	fixture_done(&f);
}

/* Refused with its batch, a record the lease no longer lets go again
 * alone was not written by the broker: given back, its attempt returned,
 * not charged as a failed publish of its own. */
static void test_batch_refused_not_sent_again(void **unused)
{
	struct fixture f;
	struct tctx t;

	(void)unused;
	batch_to_be_refused(&f, 4);
	t = tctx_new(f.pub, 10000);
	t.sends_allowed = 4; /* the first produce of each, not again */
	assert_int_equal(publish(&f, 4, &t), 0);
	for (size_t i = 0; i < 4; i++) {
		if (f.res[i].outcome != PUB_NOT_WRITTEN)
			fail_msg("record %zu: outcome %d, %s", i,
				 (int)f.res[i].outcome, f.res[i].reason);
		assert_non_null(strstr(f.res[i].reason,
				       "not sent again alone: the lease no "
				       "longer allows it"));
	}
	fixture_done(&f);
}

static void test_local_size_limit(void **unused)
{
	struct fixture f;
	struct tctx t;

	(void)unused;
	fixture_init(&f, 5000, "message.max.bytes", "1000");
	memset(big, 'x', sizeof(big));
	f.ev[0].content_type = "text/plain";
	f.ev[0].payload = (const unsigned char *)big;
	f.ev[0].payload_len = sizeof(big);
	t = tctx_new(f.pub, 5000);
	assert_int_equal(publish(&f, 2, &t), 0);
	assert_int_equal(f.res[0].outcome, PUB_PERMANENT);
	assert_non_null(strstr(f.res[0].reason, "MSG_SIZE_TOO_LARGE"));
	assert_int_equal(f.res[1].outcome, PUB_ACKED);
	fixture_done(&f);
}

static void test_destinations(void **unused)
{
	struct fixture f;
	struct tctx t;

	(void)unused;
	/* Unknown topics are reported after half the publish timeout, so
	 * before the deadline (else they would be NOT_WRITTEN). */
	fixture_init(&f, 4000, NULL, NULL);
	rd_kafka_mock_topic_set_error(cluster(&f), "missing",
				      RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
	f.ev[1].exchange = "missing";
	f.ev[2].exchange = "bad topic!";
	f.ev[3].exchange = "other";
	t = tctx_new(f.pub, 4000);
	/* A refused topic is not the publisher's fault. */
	assert_int_equal(publish(&f, 4, &t), 0);
	assert_int_equal(f.res[0].outcome, PUB_ACKED);
	assert_int_equal(f.res[1].outcome, PUB_DESTINATION);
	assert_false(f.res[1].route_scoped);
	assert_non_null(strstr(f.res[1].reason, "topic 'missing'"));
	assert_non_null(strstr(f.res[1].reason, "UNKNOWN_TOPIC"));
	assert_int_equal(f.res[2].outcome, PUB_PERMANENT);
	assert_non_null(strstr(f.res[2].reason, "not a valid Kafka topic"));
	assert_int_equal(f.res[3].outcome, PUB_ACKED);
	fixture_done(&f);
}

static void test_brokers_down(void **unused)
{
	struct fixture f;
	struct tctx t;
	char err[512] = "";
	int64_t t0;

	(void)unused;
	/* Reconnects quickly once the brokers are back; the probe waits at
	 * most the publish timeout. */
	fixture_init(&f, 2000, "reconnect.backoff.max.ms", "300");
	brokers_set(&f, false);
	t = tctx_new(f.pub, 1000);
	t0 = clock_ms();
	assert_int_equal(publish(&f, 20, &t), -1);
	tctx_end(&t);
	/* Never sent: purged at the deadline and given back. */
	expect_all(&f, 20, PUB_NOT_WRITTEN);
	assert_non_null(strstr(f.res[0].reason, "publish deadline"));
	assert_true(clock_ms() - t0 < 2500);
	/* tick() every TICK_MS. TICK_MS is 100; a loaded machine (ASan, the
	 * mock brokers, tests beside) adds scheduling delay. A publish that did
	 * not tick would show a gap of its whole budget (800 ms and more). */
	assert_true(t.max_gap_ms < 600);
	assert_int_equal(rd_kafka_outq_len(kafka_handle(f.pub)), 0);

	assert_int_equal(publisher_kafka.probe(f.pub, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "127.0.0.1:1"));
	brokers_set(&f, true);
	publish_until_acked(&f, 20, 15000);
	fixture_done(&f);
}

static void test_shutdown_purges_unsent(void **unused)
{
	struct fixture f;
	struct tctx t;
	int64_t t0;

	(void)unused;
	fixture_init(&f, 5000, NULL, NULL);
	brokers_set(&f, false);
	t = tctx_new(f.pub, 5000);
	t.stop_at_tick = 1;
	t0 = clock_ms();
	publish(&f, 10, &t);
	for (size_t i = 0; i < 10; i++) {
		assert_int_equal(f.res[i].outcome, PUB_NOT_WRITTEN);
		/* Either never handed over, or purged at shutdown. */
		assert_true(
		    strstr(f.res[i].reason, "shutting down") ||
		    strcmp(f.res[i].reason, "not handed to the broker") == 0);
	}
	/* Nothing was in flight: no need to wait for the 5 s deadline. */
	assert_true(clock_ms() - t0 < 2500);
	assert_int_equal(rd_kafka_outq_len(kafka_handle(f.pub)), 0);
	fixture_done(&f);
}

static void test_in_flight_at_deadline(void **unused)
{
	struct fixture f;
	struct tctx t;

	(void)unused;
	/* Every broker connected from the start: librdkafka otherwise
	 * connects to a partition's leader when it first needs it, and a
	 * keyless record may pick a partition the warm-up did not touch,
	 * whose connection would then wait out the slow round trip and
	 * leave the record queued, not in flight. */
	fixture_init(&f, 5000, "enable.sparse.connections", "false");
	/* Warm up: topic metadata and producer id are in place. */
	t = tctx_new(f.pub, 5000);
	assert_int_equal(publish(&f, 3, &t), 0);
	for (int32_t id = 1; id <= 3; id++)
		rd_kafka_mock_broker_set_rtt(cluster(&f), id, 2500);
	t = tctx_new(f.pub, 800);
	assert_int_equal(publish(&f, 6, &t), -1);
	/* Sent, unanswered: possibly written, so the charge is kept. */
	expect_all(&f, 6, PUB_TRANSPORT);
	assert_non_null(strstr(f.res[0].reason, "in flight"));
	for (int32_t id = 1; id <= 3; id++)
		rd_kafka_mock_broker_set_rtt(cluster(&f), id, 0);
	/* The late reports of that batch land during this one and must not
	 * settle its records (same indexes, other generation). */
	t = tctx_new(f.pub, 8000);
	assert_int_equal(publish(&f, 6, &t), 0);
	expect_all(&f, 6, PUB_ACKED);
	fixture_done(&f);
}

static void test_fatal_before_batch(void **unused)
{
	struct fixture f;
	struct tctx t;
	rd_kafka_t *before;

	(void)unused;
	fixture_init(&f, 5000, NULL, NULL);
	before = kafka_handle(f.pub);
	rd_kafka_test_fatal_error(
	    before, RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
	    "injected by the test");
	t = tctx_new(f.pub, 5000);
	assert_int_equal(publish(&f, 5, &t), 0);
	expect_all(&f, 5, PUB_ACKED);
	assert_int_equal(rd_kafka_fatal_error(kafka_handle(f.pub), NULL, 0), 0);
	fixture_done(&f);
}

static void test_fatal_during_batch(void **unused)
{
	struct fixture f;
	struct tctx t;

	(void)unused;
	fixture_init(&f, 5000, NULL, NULL);
	brokers_set(&f, false);
	t = tctx_new(f.pub, 3000);
	t.fatal_at_tick = 3;
	assert_int_equal(publish(&f, 8, &t), -1);
	/* Unconfirmed when the producer died: the charge is kept. */
	expect_all(&f, 8, PUB_TRANSPORT);
	/* A new producer (with a new mock cluster, which belongs to it). */
	assert_non_null(kafka_handle(f.pub));
	assert_int_equal(rd_kafka_fatal_error(kafka_handle(f.pub), NULL, 0), 0);
	publish_until_acked(&f, 8, 10000);
	fixture_done(&f);
}

static void test_fatal_while_idle(void **unused)
{
	struct fixture f;
	struct tctx t;
	char err[512];

	(void)unused;
	fixture_init(&f, 5000, NULL, NULL);
	rd_kafka_test_fatal_error(kafka_handle(f.pub),
				  RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH,
				  "injected by the test");
	/* service() notices between batches; probe() would as well. */
	publisher_kafka.service(f.pub);
	assert_int_equal(rd_kafka_fatal_error(kafka_handle(f.pub), NULL, 0), 0);
	assert_int_equal(publisher_kafka.probe(f.pub, err, sizeof(err)), 0);
	t = tctx_new(f.pub, 5000);
	assert_int_equal(publish(&f, 4, &t), 0);
	expect_all(&f, 4, PUB_ACKED);
	fixture_done(&f);
}

static void test_queue_full(void **unused)
{
	struct fixture f;
	struct tctx t;

	(void)unused;
	fixture_init(&f, 5000, "queue.buffering.max.messages", "4");
	/* Waits for room instead of giving up. */
	t = tctx_new(f.pub, 5000);
	assert_int_equal(publish(&f, MAXEV, &t), 0);
	expect_all(&f, MAXEV, PUB_ACKED);

	brokers_set(&f, false);
	t = tctx_new(f.pub, 800);
	assert_int_equal(publish(&f, 10, &t), -1);
	tctx_end(&t);
	expect_all(&f, 10, PUB_NOT_WRITTEN);
	/* Four fill the queue; the fifth waits for room until the
	 * deadline; the rest are not even tried. */
	assert_non_null(strstr(f.res[0].reason, "publish deadline"));
	assert_non_null(strstr(f.res[4].reason, "QUEUE_FULL"));
	assert_non_null(strstr(f.res[9].reason, "publish deadline"));
	/* TICK_MS is 100; a loaded machine (ASan, the mock brokers, tests
	 * beside) adds scheduling delay. A publish that did not tick would
	 * show a gap of its whole budget (800 ms and more). */
	assert_true(t.max_gap_ms < 600);
	fixture_done(&f);
}

static void test_depth_gauge(void **unused)
{
	struct fixture f;
	rd_kafka_t *rk;

	(void)unused;
	fixture_init(&f, 5000, NULL, NULL);
	rk = kafka_handle(f.pub);
	brokers_set(&f, false);
	/* A record no batch waits for (as a late one would be). */
	assert_int_equal(
	    rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("t1"),
			      RD_KAFKA_V_VALUE((void *)"x", 1),
			      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
			      RD_KAFKA_V_OPAQUE((void *)~0UL), RD_KAFKA_V_END),
	    0);
	/* outq_len also counts librdkafka's own events (a broker-down error
	 * queued between service() and the read below), so the two agree
	 * only once service() has seen a quiet queue: a few tries. */
	for (int i = 0; i < 50; i++) {
		publisher_kafka.service(f.pub);
		if (metrics_gauge(MG_KAFKA_QUEUE_DEPTH) ==
		    rd_kafka_outq_len(rk))
			break;
		clock_sleep_ms(20);
	}
	assert_true(metrics_gauge(MG_KAFKA_QUEUE_DEPTH) >= 1);
	assert_int_equal(metrics_gauge(MG_KAFKA_QUEUE_DEPTH),
			 rd_kafka_outq_len(rk));
	/* close() purges it and takes its share out of the gauge. */
	fixture_done(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_acked),
	    cmocka_unit_test(test_may_send),
	    cmocka_unit_test(test_dead_peer_defaults),
	    cmocka_unit_test(test_batch_not_lingered),
	    cmocka_unit_test(test_retryable_errors),
	    cmocka_unit_test(test_broker_refuses_size),
	    cmocka_unit_test(test_batch_refused_as_too_large),
	    cmocka_unit_test(test_batch_refused_not_sent_again),
	    cmocka_unit_test(test_local_size_limit),
	    cmocka_unit_test(test_destinations),
	    cmocka_unit_test(test_brokers_down),
	    cmocka_unit_test(test_shutdown_purges_unsent),
	    cmocka_unit_test(test_in_flight_at_deadline),
	    cmocka_unit_test(test_fatal_before_batch),
	    cmocka_unit_test(test_fatal_during_batch),
	    cmocka_unit_test(test_fatal_while_idle),
	    cmocka_unit_test(test_queue_full),
	    cmocka_unit_test(test_depth_gauge),
	};

	/* librdkafka's notices stay out of the test output. */
	log_setup(LOG_ERROR, false);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
