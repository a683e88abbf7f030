/* SPDX-License-Identifier: MIT */
/*
 * Benchmark consumer: declares an exchange, a queue and a binding, then
 * consumes as fast as RabbitMQ delivers (auto-ack) and prints one JSON line:
 * how many messages came, the wall-clock times of the first and the last,
 * and the end-to-end latency of each (receipt time minus the CloudEvents
 * time header, which the relay copies from the row's created_at) as
 * p50/p99/max. Not part of the relay; tests/bench/bench.py drives it.
 *
 * Usage: bench_consume --url URL --exchange X --queue Q [--purge]
 *                      [--count N] [--idle-timeout SEC] [--time-header H]
 *                      [--ready-file PATH] [--since EPOCH]
 *   With --count 0 (the default) it consumes until SEC seconds (default 5)
 *   pass without a message; with N > 0 it stops after N messages and exits
 *   3 if SEC seconds of silence come first. --purge empties the queue
 *   before consuming. --ready-file is created once the consumer is
 *   subscribed, so a caller can start publishing without a race.
 *   --since leaves events created before EPOCH (seconds) out of the
 *   latency figures (a warm-up), though they still count as consumed.
 *   Exit status: 0 done, 1 error, 2 usage, 3 idle before N messages.
 */
#include <errno.h>
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

#include "publishers/amqp_map.h"

#define PROG "bench_consume"

struct options {
	const char *url;
	const char *exchange;
	const char *queue;
	const char *time_header;
	const char *ready_file;
	bool purge;
	int64_t since_us; /* latency only of events created from here on */
	long count;
	long idle_s;
};

/* Latencies in microseconds; grows by doubling. */
struct samples {
	int64_t *v;
	size_t n, cap;
};

static void usage(void)
{
	fprintf(stderr,
		"usage: " PROG " --url URL --exchange X --queue Q [--purge] "
		"[--count N] [--idle-timeout SEC] [--time-header H] "
		"[--ready-file PATH] [--since EPOCH]\n");
	exit(2);
}

static void die(const char *what)
{
	fprintf(stderr, PROG ": %s\n", what);
	exit(1);
}

static long parse_long(const char *s, long max)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 0 || v > max)
		usage();
	return v;
}

static int64_t parse_epoch_us(const char *s)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || v < 0 || v > 1e11)
		usage();
	return (int64_t)(v * 1e6);
}

static void parse_args(int argc, char **argv, struct options *o)
{
	o->time_header = "ce-time";
	o->idle_s = 5;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (strcmp(a, "--purge") == 0) {
			o->purge = true;
			continue;
		}
		if (i + 1 >= argc)
			usage();
		if (strcmp(a, "--url") == 0)
			o->url = argv[++i];
		else if (strcmp(a, "--exchange") == 0)
			o->exchange = argv[++i];
		else if (strcmp(a, "--queue") == 0)
			o->queue = argv[++i];
		else if (strcmp(a, "--count") == 0)
			o->count = parse_long(argv[++i], 1000000000L);
		else if (strcmp(a, "--idle-timeout") == 0)
			o->idle_s = parse_long(argv[++i], 86400);
		else if (strcmp(a, "--time-header") == 0)
			o->time_header = argv[++i];
		else if (strcmp(a, "--ready-file") == 0)
			o->ready_file = argv[++i];
		else if (strcmp(a, "--since") == 0)
			o->since_us = parse_epoch_us(argv[++i]);
		else
			usage();
	}
	if (!o->url || !o->exchange || !o->queue || o->idle_s == 0)
		usage();
}

static void check_reply(amqp_rpc_reply_t r, const char *what)
{
	char why[256], msg[512];

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return;
	rmq_map_describe_reply(r, why, sizeof(why));
	snprintf(msg, sizeof(msg), "%s: %s", what, why);
	die(msg);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* "YYYY-MM-DDTHH:MM:SS[.ffffff]Z" (what the relay writes) to microseconds
 * since the epoch; -1 if it does not look like that. */
static int64_t parse_time_us(const char *s, size_t len)
{
	char buf[64];
	struct tm tm = {0};
	const char *rest;
	int64_t frac = 0, scale = 1000000;

	if (len == 0 || len >= sizeof(buf))
		return -1;
	memcpy(buf, s, len);
	buf[len] = '\0';
	rest = strptime(buf, "%Y-%m-%dT%H:%M:%S", &tm);
	if (!rest)
		return -1;
	if (*rest == '.') {
		rest++;
		while (*rest >= '0' && *rest <= '9') {
			if (scale > 1) {
				scale /= 10;
				frac += (*rest - '0') * scale;
			}
			rest++;
		}
	}
	if (strcmp(rest, "Z") != 0)
		return -1;
	return (int64_t)timegm(&tm) * 1000000 + frac;
}

static void samples_add(struct samples *s, int64_t v)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 4096;
		int64_t *p = realloc(s->v, cap * sizeof(*p));

		if (!p)
			die("out of memory");
		s->v = p;
		s->cap = cap;
	}
	s->v[s->n++] = v;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

/* Nearest-rank percentile of sorted samples. */
static double pct_ms(const struct samples *s, double p)
{
	size_t rank;

	if (s->n == 0)
		return 0;
	rank = (size_t)(p / 100.0 * (double)s->n + 0.999999);
	if (rank < 1)
		rank = 1;
	if (rank > s->n)
		rank = s->n;
	return (double)s->v[rank - 1] / 1000.0;
}

static void take_latency(const amqp_envelope_t *env, const char *name,
			 int64_t since_us, double received, struct samples *lat)
{
	const amqp_basic_properties_t *p = &env->message.properties;
	size_t name_len = strlen(name);

	if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG))
		return;
	for (int i = 0; i < p->headers.num_entries; i++) {
		const amqp_table_entry_t *e = &p->headers.entries[i];
		int64_t sent;

		if (e->key.len != name_len ||
		    memcmp(e->key.bytes, name, name_len) != 0 ||
		    e->value.kind != AMQP_FIELD_KIND_UTF8)
			continue;
		sent = parse_time_us(e->value.value.bytes.bytes,
				     e->value.value.bytes.len);
		if (sent >= since_us)
			samples_add(lat, (int64_t)(received * 1e6) - sent);
		return;
	}
}

static amqp_connection_state_t connect_broker(const char *url_arg)
{
	struct amqp_connection_info ci;
	struct timeval tv = {10, 0};
	amqp_connection_state_t conn;
	amqp_socket_t *sock;
	char *url = strdup(url_arg);

	if (!url)
		die("out of memory");
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
	free(url);
	amqp_channel_open(conn, 1);
	check_reply(amqp_get_rpc_reply(conn), "channel.open");
	return conn;
}

static void declare(amqp_connection_state_t conn, const struct options *o)
{
	amqp_exchange_declare(conn, 1, amqp_cstring_bytes(o->exchange),
			      amqp_cstring_bytes("topic"), 0, 1, 0, 0,
			      amqp_empty_table);
	check_reply(amqp_get_rpc_reply(conn), "exchange.declare");
	amqp_queue_declare(conn, 1, amqp_cstring_bytes(o->queue), 0, 1, 0, 0,
			   amqp_empty_table);
	check_reply(amqp_get_rpc_reply(conn), "queue.declare");
	amqp_queue_bind(conn, 1, amqp_cstring_bytes(o->queue),
			amqp_cstring_bytes(o->exchange),
			amqp_cstring_bytes("#"), amqp_empty_table);
	check_reply(amqp_get_rpc_reply(conn), "queue.bind");
	if (o->purge) {
		amqp_queue_purge(conn, 1, amqp_cstring_bytes(o->queue));
		check_reply(amqp_get_rpc_reply(conn), "queue.purge");
	}
}

int main(int argc, char **argv)
{
	struct options o = {0};
	struct samples lat = {0};
	amqp_connection_state_t conn;
	double first = 0, last = 0;
	long got = 0;
	int status = 0;

	parse_args(argc, argv, &o);
	conn = connect_broker(o.url);
	declare(conn, &o);
	amqp_basic_consume(conn, 1, amqp_cstring_bytes(o.queue),
			   amqp_empty_bytes, 0, 1, 0, amqp_empty_table);
	check_reply(amqp_get_rpc_reply(conn), "basic.consume");
	if (o.ready_file) {
		FILE *f = fopen(o.ready_file, "w");

		if (!f || fclose(f) != 0)
			die("cannot create the ready file");
	}
	while (o.count == 0 || got < o.count) {
		struct timeval idle = {o.idle_s, 0};
		amqp_envelope_t env;
		amqp_rpc_reply_t r;
		double t;

		amqp_maybe_release_buffers(conn);
		r = amqp_consume_message(conn, &env, &idle, 0);
		if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
		    (r.library_error == AMQP_STATUS_TIMEOUT ||
		     r.library_error == -AMQP_STATUS_TIMEOUT)) {
			if (o.count > 0) {
				fprintf(stderr,
					PROG ": idle for %lds after %ld of %ld "
					     "messages\n",
					o.idle_s, got, o.count);
				status = 3;
			}
			break;
		}
		check_reply(r, "consuming");
		t = now_s();
		if (got == 0)
			first = t;
		last = t;
		take_latency(&env, o.time_header, o.since_us, t, &lat);
		amqp_destroy_envelope(&env);
		got++;
	}
	if (lat.n > 0)
		qsort(lat.v, lat.n, sizeof(*lat.v), cmp_i64);
	printf("{\"count\":%ld,\"first_s\":%.6f,\"last_s\":%.6f,"
	       "\"latency_ms\":{\"n\":%zu,\"p50\":%.3f,\"p99\":%.3f,"
	       "\"max\":%.3f,\"cdf\":[",
	       got, first, last, lat.n, pct_ms(&lat, 50), pct_ms(&lat, 99),
	       pct_ms(&lat, 100));
	/* The distribution for the benchmark's chart: the latency at every
	 * whole percentile, 0 (the fastest: rank 1) to 100 (the slowest). */
	for (int p = 0; p <= 100; p++)
		printf("%s%.3f", p ? "," : "", pct_ms(&lat, p));
	printf("]}}\n");
	free(lat.v);
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	amqp_destroy_connection(conn);
	return status;
}
