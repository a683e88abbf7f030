/* SPDX-License-Identifier: MIT */
/*
 * Benchmark publisher: the broker's own limit, for the relay's throughput
 * to be compared against. It publishes N persistent messages of SIZE bytes
 * carrying the same CloudEvents headers the relay writes, with the same
 * delivery guarantee (AMQP: mandatory, publisher confirms pipelined with a
 * window of W unconfirmed messages; Kafka: idempotent, acks=all, a delivery
 * report per message), and prints one JSON line with the rate. Not part of
 * the relay; tests/bench/bench.py drives it.
 *
 * With --rate R (AMQP) it is the broker floor of the latency figures
 * instead: the same confirmed publisher paced at R messages/s, each
 * stamped with its publish time in ce-time, so the consumer's latency is
 * what the broker alone adds.
 *
 * Usage: bench_publish amqp --url URL --exchange X [--count N] [--size B]
 *                           [--window W] [--rate R]
 *        bench_publish kafka --brokers LIST --topic T [--count N] [--size B]
 *   Defaults: N 100000, B 1024, W 1000, no pacing. Exit status: 0 when
 *   every message was confirmed, 1 otherwise or on errors, 2 on bad usage.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <librdkafka/rdkafka.h>

#include "publishers/amqp_map.h"

#define PROG "bench_publish"
#define N_HEADERS 5

struct options {
	bool kafka;
	const char *url;      /* amqp */
	const char *exchange; /* amqp */
	const char *brokers;  /* kafka */
	const char *topic;    /* kafka */
	long count;
	long size;
	long window;
	long rate; /* messages/s, 0: as fast as confirms allow */
};

/* What was confirmed, by delivery tag (AMQP) or by report (Kafka). */
struct tally {
	long acked;
	long nacked;
	long returned;
};

static void usage(void)
{
	fprintf(stderr,
		"usage: " PROG " amqp --url URL --exchange X [--count N] "
		"[--size B] [--window W] [--rate R]\n"
		"       " PROG " kafka --brokers LIST --topic T [--count N] "
		"[--size B]\n");
	exit(2);
}

static void die(const char *what)
{
	fprintf(stderr, PROG ": %s\n", what);
	exit(1);
}

static long parse_long(const char *s, long min, long max)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < min || v > max)
		usage();
	return v;
}

static void parse_args(int argc, char **argv, struct options *o)
{
	o->count = 100000;
	o->size = 1024;
	o->window = 1000;
	if (argc < 2)
		usage();
	if (strcmp(argv[1], "kafka") == 0)
		o->kafka = true;
	else if (strcmp(argv[1], "amqp") != 0)
		usage();
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];

		if (i + 1 >= argc)
			usage();
		if (strcmp(a, "--url") == 0)
			o->url = argv[++i];
		else if (strcmp(a, "--exchange") == 0)
			o->exchange = argv[++i];
		else if (strcmp(a, "--brokers") == 0)
			o->brokers = argv[++i];
		else if (strcmp(a, "--topic") == 0)
			o->topic = argv[++i];
		else if (strcmp(a, "--count") == 0)
			o->count = parse_long(argv[++i], 1, 100000000L);
		else if (strcmp(a, "--size") == 0)
			o->size = parse_long(argv[++i], 1, 100000000L);
		else if (strcmp(a, "--window") == 0)
			o->window = parse_long(argv[++i], 1, 1000000L);
		else if (strcmp(a, "--rate") == 0)
			o->rate = parse_long(argv[++i], 1, 1000000L);
		else
			usage();
	}
	if (o->kafka ? (!o->brokers || !o->topic || o->rate)
		     : (!o->url || !o->exchange))
		usage();
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A UUID-shaped id unique within the run, like the relay's event ids. */
static void make_id(char *buf, size_t len, long seq)
{
	snprintf(buf, len, "00000000-0000-7000-8000-%012lx", seq);
}

static void make_time(char *buf, size_t len)
{
	struct timespec ts;
	struct tm tm;
	char base[32];

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(buf, len, "%s.%06ldZ", base, ts.tv_nsec / 1000);
}

/* ---- AMQP ---- */

static void check_reply(amqp_rpc_reply_t r, const char *what)
{
	char why[256], msg[512];

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return;
	rmq_map_describe_reply(r, why, sizeof(why));
	snprintf(msg, sizeof(msg), "%s: %s", what, why);
	die(msg);
}

/* Confirms settle tags one by one or, with `multiple`, every tag up to
 * one; `done` marks settled tags so a tag is never counted twice. */
struct confirms {
	bool *done;	/* indexed by delivery tag, 1..count */
	long low;	/* lowest tag not known to be settled */
	long published; /* highest tag sent */
	long settled;
};

static void settle(struct confirms *c, struct tally *t, uint64_t tag,
		   bool multiple, bool ack)
{
	long from = multiple ? c->low : (long)tag;

	if (tag == 0 || (long)tag > c->published)
		die("confirm for a delivery tag never published");
	for (long i = from; i <= (long)tag; i++) {
		if (c->done[i])
			continue;
		c->done[i] = true;
		c->settled++;
		if (ack)
			t->acked++;
		else
			t->nacked++;
	}
	while (c->low <= c->published && c->done[c->low])
		c->low++;
}

/* Reads one frame, waiting at most wait_us, and applies what it says;
 * false when none came in time. */
static bool read_frame_within(amqp_connection_state_t conn, struct confirms *c,
			      struct tally *t, long wait_us)
{
	struct timeval tv = {wait_us / 1000000, wait_us % 1000000};
	amqp_frame_t f;
	int rc = amqp_simple_wait_frame_noblock(conn, &f, &tv);

	if (rc == AMQP_STATUS_TIMEOUT)
		return false;
	if (rc != AMQP_STATUS_OK)
		die(amqp_error_string2(rc));
	if (f.frame_type != AMQP_FRAME_METHOD)
		return true;
	switch (f.payload.method.id) {
	case AMQP_BASIC_ACK_METHOD: {
		const amqp_basic_ack_t *a = f.payload.method.decoded;

		settle(c, t, a->delivery_tag, a->multiple, true);
		break;
	}
	case AMQP_BASIC_NACK_METHOD: {
		const amqp_basic_nack_t *n = f.payload.method.decoded;

		settle(c, t, n->delivery_tag, n->multiple, false);
		break;
	}
	case AMQP_BASIC_RETURN_METHOD: {
		amqp_message_t msg;

		/* The returned message's header and body follow; its ack
		 * comes after them. */
		check_reply(amqp_read_message(conn, f.channel, &msg, 0),
			    "reading a returned message");
		amqp_destroy_message(&msg);
		t->returned++;
		break;
	}
	case AMQP_CHANNEL_CLOSE_METHOD:
	case AMQP_CONNECTION_CLOSE_METHOD:
		die("the broker closed the channel");
		break;
	default:
		break;
	}
	return true;
}

/* Reads one frame (waiting at most 30 s) and applies what it says. */
static void read_frame(amqp_connection_state_t conn, struct confirms *c,
		       struct tally *t)
{
	if (!read_frame_within(conn, c, t, 30000000L))
		die("no confirm from the broker within 30 s");
}

/* With --rate, waits for message seq's turn, reading confirms meanwhile. */
static void pace(const struct options *o, amqp_connection_state_t conn,
		 struct confirms *c, struct tally *t, double t0, long seq)
{
	double due = t0 + (double)(seq - 1) / (double)o->rate;
	double left;

	while (o->rate && (left = due - now_s()) > 0)
		read_frame_within(conn, c, t, (long)(left * 1e6) + 1);
}

static double run_amqp(const struct options *o, struct tally *t)
{
	struct amqp_connection_info ci;
	struct timeval tv = {10, 0};
	struct confirms c = {0};
	amqp_connection_state_t conn;
	amqp_socket_t *sock;
	amqp_table_entry_t h[N_HEADERS];
	char id[64], tm[64];
	char *url = strdup(o->url);
	char *body = malloc((size_t)o->size);
	double t0;

	c.done = calloc((size_t)o->count + 1, sizeof(*c.done));
	if (!url || !body || !c.done)
		die("out of memory");
	memset(body, 'x', (size_t)o->size);
	amqp_default_connection_info(&ci);
	if (amqp_parse_url(url, &ci) != AMQP_STATUS_OK)
		die("bad URL");
	conn = amqp_new_connection();
	sock = amqp_tcp_socket_new(conn);
	if (!sock || amqp_socket_open_noblock(sock, ci.host, ci.port, &tv) !=
			 AMQP_STATUS_OK)
		die("cannot connect to the broker");
	amqp_set_rpc_timeout(conn, &tv);
	check_reply(amqp_login(conn, *ci.vhost ? ci.vhost : "/", 0, 131072, 0,
			       AMQP_SASL_METHOD_PLAIN, ci.user, ci.password),
		    "login");
	amqp_channel_open(conn, 1);
	check_reply(amqp_get_rpc_reply(conn), "channel.open");
	amqp_confirm_select(conn, 1);
	check_reply(amqp_get_rpc_reply(conn), "confirm.select");

	const char *keys[N_HEADERS] = {"ce-specversion", "ce-id", "ce-source",
				       "ce-type", "ce-time"};
	for (int i = 0; i < N_HEADERS; i++) {
		h[i].key = amqp_cstring_bytes(keys[i]);
		h[i].value.kind = AMQP_FIELD_KIND_UTF8;
	}
	h[0].value.value.bytes = amqp_cstring_bytes("1.0");
	h[2].value.value.bytes = amqp_cstring_bytes("/bench");
	h[3].value.value.bytes = amqp_cstring_bytes("bench.event");

	c.low = 1;
	t0 = now_s();
	for (long seq = 1; seq <= o->count; seq++) {
		amqp_basic_properties_t p = {0};
		amqp_bytes_t b = {(size_t)o->size, body};

		while (c.published - c.settled >= o->window)
			read_frame(conn, &c, t);
		pace(o, conn, &c, t, t0, seq);
		make_id(id, sizeof(id), seq);
		make_time(tm, sizeof(tm));
		h[1].value.value.bytes = amqp_cstring_bytes(id);
		h[4].value.value.bytes = amqp_cstring_bytes(tm);
		p._flags = AMQP_BASIC_CONTENT_TYPE_FLAG |
			   AMQP_BASIC_DELIVERY_MODE_FLAG |
			   AMQP_BASIC_MESSAGE_ID_FLAG |
			   AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_TIMESTAMP_FLAG;
		p.content_type = amqp_cstring_bytes("application/json");
		p.delivery_mode = 2;
		p.message_id = amqp_cstring_bytes(id);
		p.timestamp = (uint64_t)time(NULL);
		p.headers.num_entries = N_HEADERS;
		p.headers.entries = h;
		if (amqp_basic_publish(conn, 1, amqp_cstring_bytes(o->exchange),
				       amqp_cstring_bytes("bench"), 1, 0, &p,
				       b) != AMQP_STATUS_OK)
			die("publish failed");
		c.published = seq;
	}
	while (c.settled < c.published)
		read_frame(conn, &c, t);
	double elapsed = now_s() - t0;

	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	free(c.done);
	free(body);
	free(url);
	return elapsed;
}

/* ---- Kafka ---- */

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m,
			void *opaque)
{
	struct tally *t = opaque;

	(void)rk;
	if (m->err)
		t->nacked++;
	else
		t->acked++;
}

static void conf_set(rd_kafka_conf_t *conf, const char *k, const char *v)
{
	char err[512];

	if (rd_kafka_conf_set(conf, k, v, err, sizeof(err)) != RD_KAFKA_CONF_OK)
		die(err);
}

static double run_kafka(const struct options *o, struct tally *t)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char *body = malloc((size_t)o->size);
	char err[512], id[64], tm[64];
	rd_kafka_t *rk;
	double t0;

	if (!body)
		die("out of memory");
	memset(body, 'x', (size_t)o->size);
	conf_set(conf, "bootstrap.servers", o->brokers);
	conf_set(conf, "enable.idempotence", "true");
	conf_set(conf, "acks", "all");
	rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
	rd_kafka_conf_set_opaque(conf, t);
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (!rk)
		die(err);
	t0 = now_s();
	for (long seq = 1; seq <= o->count; seq++) {
		rd_kafka_resp_err_t e;

		make_id(id, sizeof(id), seq);
		make_time(tm, sizeof(tm));
		for (;;) {
			e = rd_kafka_producev(
			    rk, RD_KAFKA_V_TOPIC(o->topic),
			    RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
			    RD_KAFKA_V_VALUE(body, (size_t)o->size),
			    RD_KAFKA_V_HEADER("ce_specversion", "1.0", -1),
			    RD_KAFKA_V_HEADER("ce_id", id, -1),
			    RD_KAFKA_V_HEADER("ce_source", "/bench", -1),
			    RD_KAFKA_V_HEADER("ce_type", "bench.event", -1),
			    RD_KAFKA_V_HEADER("ce_time", tm, -1),
			    RD_KAFKA_V_HEADER("content-type",
					      "application/json", -1),
			    RD_KAFKA_V_END);
			if (e != RD_KAFKA_RESP_ERR__QUEUE_FULL)
				break;
			rd_kafka_poll(rk, 10);
		}
		if (e)
			die(rd_kafka_err2str(e));
		rd_kafka_poll(rk, 0);
	}
	if (rd_kafka_flush(rk, 120000) != RD_KAFKA_RESP_ERR_NO_ERROR)
		die("messages still unconfirmed after 120 s");
	double elapsed = now_s() - t0;

	rd_kafka_destroy(rk);
	free(body);
	return elapsed;
}

int main(int argc, char **argv)
{
	struct options o = {0};
	struct tally t = {0};
	double s;

	parse_args(argc, argv, &o);
	s = o.kafka ? run_kafka(&o, &t) : run_amqp(&o, &t);
	printf("{\"broker\":\"%s\",\"messages\":%ld,\"size\":%ld,"
	       "\"window\":%ld,\"seconds\":%.6f,\"per_s\":%.1f,"
	       "\"acked\":%ld,\"nacked\":%ld,\"returned\":%ld}\n",
	       o.kafka ? "kafka" : "amqp", o.count, o.size,
	       o.kafka ? 0 : o.window, s, s > 0 ? (double)o.count / s : 0,
	       t.acked, t.nacked, t.returned);
	return t.acked == o.count && t.returned == 0 ? 0 : 1;
}
