/* SPDX-License-Identifier: MIT */
/*
 * Test helper: sets up exchanges, a queue and bindings on a RabbitMQ node
 * and consumes from the queue, printing one JSON line per message
 * (exchange, routing key, basic properties, headers, base64 body) so the
 * integration tests can check what the relay published. Not part of the
 * relay.
 *
 * Usage: amqp_consume [--url URL] [--declare-exchange X]... [--queue Q]
 *                     [--max-length N] [--bind X:KEY]... [--count N]
 *                     [--idle-timeout SEC]
 *   URL defaults to $RELAY_TEST_AMQP_URL. Exchanges are durable topic
 *   exchanges; the queue is durable and outlives the consumer; with
 *   --max-length it holds at most N messages and the broker refuses
 *   (basic.nack) publishes beyond (x-overflow reject-publish). With
 *   --count 0 (the default) it only sets up. Exit status: 0 after N
 *   messages (or after setup), 3 when SEC seconds (default 10) passed
 *   without a message first, 1 on errors, 2 on bad usage.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <cJSON.h>

#include "publishers/amqp_map.h"

#define MAX_ITEMS 32

struct options {
	const char *url;
	const char *exchanges[MAX_ITEMS];
	size_t n_exchanges;
	const char *queue;
	long max_length; /* 0: unbounded */
	const char *binds[MAX_ITEMS];
	size_t n_binds;
	long count;
	long idle_s;
};

static void usage(void)
{
	fprintf(stderr,
		"usage: amqp_consume [--url URL] [--declare-exchange X]... "
		"[--queue Q] [--max-length N] [--bind X:KEY]... [--count N] "
		"[--idle-timeout SEC]\n");
	exit(2);
}

static long parse_count(const char *s)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 0 || v > 100000000)
		usage();
	return v;
}

static void parse_args(int argc, char **argv, struct options *o)
{
	o->url = getenv("RELAY_TEST_AMQP_URL");
	o->idle_s = 10;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (i + 1 >= argc)
			usage();
		if (strcmp(a, "--url") == 0) {
			o->url = argv[++i];
		} else if (strcmp(a, "--declare-exchange") == 0) {
			if (o->n_exchanges == MAX_ITEMS)
				usage();
			o->exchanges[o->n_exchanges++] = argv[++i];
		} else if (strcmp(a, "--queue") == 0) {
			o->queue = argv[++i];
		} else if (strcmp(a, "--max-length") == 0) {
			o->max_length = parse_count(argv[++i]);
		} else if (strcmp(a, "--bind") == 0) {
			if (o->n_binds == MAX_ITEMS ||
			    !strchr(argv[i + 1], ':'))
				usage();
			o->binds[o->n_binds++] = argv[++i];
		} else if (strcmp(a, "--count") == 0) {
			o->count = parse_count(argv[++i]);
		} else if (strcmp(a, "--idle-timeout") == 0) {
			o->idle_s = parse_count(argv[++i]);
		} else {
			usage();
		}
	}
	if (!o->url || ((o->n_binds > 0 || o->count > 0) && !o->queue))
		usage();
}

static void die_reply(amqp_rpc_reply_t r, const char *what)
{
	char why[256];

	if (r.reply_type == AMQP_RESPONSE_NORMAL)
		return;
	rmq_map_describe_reply(r, why, sizeof(why));
	fprintf(stderr, "amqp_consume: %s: %s\n", what, why);
	exit(1);
}

static char *dup_bytes(amqp_bytes_t b)
{
	char *s = malloc(b.len + 1);

	if (!s) {
		fprintf(stderr, "amqp_consume: out of memory\n");
		exit(1);
	}
	memcpy(s, b.bytes, b.len);
	s[b.len] = '\0';
	return s;
}

static char *base64(const unsigned char *src, size_t n)
{
	static const char tbl[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	char *out = malloc((n + 2) / 3 * 4 + 1);
	size_t i = 0, o = 0;

	if (!out) {
		fprintf(stderr, "amqp_consume: out of memory\n");
		exit(1);
	}
	for (; n - i >= 3; i += 3) {
		unsigned v = (unsigned)src[i] << 16 |
			     (unsigned)src[i + 1] << 8 | src[i + 2];

		out[o++] = tbl[v >> 18 & 63];
		out[o++] = tbl[v >> 12 & 63];
		out[o++] = tbl[v >> 6 & 63];
		out[o++] = tbl[v & 63];
	}
	if (i < n) {
		unsigned v = (unsigned)src[i] << 16;

		if (n - i == 2)
			v |= (unsigned)src[i + 1] << 8;
		out[o++] = tbl[v >> 18 & 63];
		out[o++] = tbl[v >> 12 & 63];
		out[o++] = n - i == 2 ? tbl[v >> 6 & 63] : '=';
		out[o++] = '=';
	}
	out[o] = '\0';
	return out;
}

static void add_bytes(cJSON *obj, const char *name, amqp_bytes_t b)
{
	char *s = dup_bytes(b);

	cJSON_AddStringToObject(obj, name, s);
	free(s);
}

/* Header values as strings; other field kinds as "<kind X>" so a test
 * expecting a string sees the difference. */
static cJSON *headers_json(const amqp_table_t *t)
{
	cJSON *h = cJSON_CreateObject();

	for (int i = 0; i < t->num_entries; i++) {
		const amqp_table_entry_t *e = &t->entries[i];
		char *key = dup_bytes(e->key);

		if (e->value.kind == AMQP_FIELD_KIND_UTF8) {
			char *v = dup_bytes(e->value.value.bytes);

			cJSON_AddStringToObject(h, key, v);
			free(v);
		} else {
			char kind[32];

			snprintf(kind, sizeof(kind), "<kind %c>",
				 (char)e->value.kind);
			cJSON_AddStringToObject(h, key, kind);
		}
		free(key);
	}
	return h;
}

static void print_message(const amqp_envelope_t *env)
{
	const amqp_basic_properties_t *p = &env->message.properties;
	cJSON *line = cJSON_CreateObject();
	cJSON *props = cJSON_CreateObject();
	char *body, *text;

	add_bytes(line, "exchange", env->exchange);
	add_bytes(line, "routing_key", env->routing_key);
	cJSON_AddBoolToObject(line, "redelivered", env->redelivered);
	if (p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG)
		add_bytes(props, "content_type", p->content_type);
	if (p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG)
		add_bytes(props, "message_id", p->message_id);
	if (p->_flags & AMQP_BASIC_TYPE_FLAG)
		add_bytes(props, "type", p->type);
	if (p->_flags & AMQP_BASIC_APP_ID_FLAG)
		add_bytes(props, "app_id", p->app_id);
	if (p->_flags & AMQP_BASIC_EXPIRATION_FLAG)
		add_bytes(props, "expiration", p->expiration);
	if (p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG)
		cJSON_AddNumberToObject(props, "delivery_mode",
					p->delivery_mode);
	if (p->_flags & AMQP_BASIC_TIMESTAMP_FLAG)
		cJSON_AddNumberToObject(props, "timestamp",
					(double)p->timestamp);
	cJSON_AddItemToObject(line, "properties", props);
	cJSON_AddItemToObject(line, "headers",
			      p->_flags & AMQP_BASIC_HEADERS_FLAG
				  ? headers_json(&p->headers)
				  : cJSON_CreateObject());
	body = base64(env->message.body.bytes, env->message.body.len);
	cJSON_AddStringToObject(line, "body_base64", body);
	free(body);
	text = cJSON_PrintUnformatted(line);
	if (!text) {
		fprintf(stderr, "amqp_consume: out of memory\n");
		exit(1);
	}
	printf("%s\n", text);
	fflush(stdout);
	cJSON_free(text);
	cJSON_Delete(line);
}

/* Freed at exit on every path, so a sanitizer build reports no leaks. */
static amqp_connection_state_t conn;
static char *url;

static void cleanup(void)
{
	if (conn)
		amqp_destroy_connection(conn);
	free(url);
}

int main(int argc, char **argv)
{
	struct options o = {0};
	struct amqp_connection_info ci;
	amqp_socket_t *sock;
	struct timeval tv = {10, 0};
	long got = 0;

	parse_args(argc, argv, &o);
	atexit(cleanup);
	url = strdup(o.url);
	if (!url)
		return 1;
	amqp_default_connection_info(&ci);
	if (amqp_parse_url(url, &ci) != AMQP_STATUS_OK) {
		fprintf(stderr, "amqp_consume: bad URL\n");
		return 2;
	}
	conn = amqp_new_connection();
	sock = amqp_tcp_socket_new(conn);
	if (!sock || amqp_socket_open_noblock(sock, ci.host, ci.port, &tv) !=
			 AMQP_STATUS_OK) {
		fprintf(stderr, "amqp_consume: cannot connect to %s:%d\n",
			ci.host, ci.port);
		return 1;
	}
	amqp_set_rpc_timeout(conn, &tv);
	die_reply(amqp_login(conn, *ci.vhost ? ci.vhost : "/", 0, 131072, 0,
			     AMQP_SASL_METHOD_PLAIN, ci.user, ci.password),
		  "login");
	amqp_channel_open(conn, 1);
	die_reply(amqp_get_rpc_reply(conn), "channel.open");
	for (size_t i = 0; i < o.n_exchanges; i++) {
		amqp_exchange_declare(
		    conn, 1, amqp_cstring_bytes(o.exchanges[i]),
		    amqp_cstring_bytes("topic"), 0, 1, 0, 0, amqp_empty_table);
		die_reply(amqp_get_rpc_reply(conn), "exchange.declare");
	}
	if (o.queue) {
		amqp_table_entry_t args[2];
		amqp_table_t table = {0, args};

		if (o.max_length > 0) {
			args[0].key = amqp_cstring_bytes("x-max-length");
			args[0].value.kind = AMQP_FIELD_KIND_I64;
			args[0].value.value.i64 = o.max_length;
			args[1].key = amqp_cstring_bytes("x-overflow");
			args[1].value.kind = AMQP_FIELD_KIND_UTF8;
			args[1].value.value.bytes =
			    amqp_cstring_bytes("reject-publish");
			table.num_entries = 2;
		}
		amqp_queue_declare(conn, 1, amqp_cstring_bytes(o.queue), 0, 1,
				   0, 0, table);
		die_reply(amqp_get_rpc_reply(conn), "queue.declare");
	}
	for (size_t i = 0; i < o.n_binds; i++) {
		char *spec = strdup(o.binds[i]);
		char *colon = spec ? strchr(spec, ':') : NULL;

		if (!colon) {
			free(spec);
			return 1;
		}
		*colon = '\0';
		amqp_queue_bind(conn, 1, amqp_cstring_bytes(o.queue),
				amqp_cstring_bytes(spec),
				amqp_cstring_bytes(colon + 1),
				amqp_empty_table);
		die_reply(amqp_get_rpc_reply(conn), "queue.bind");
		free(spec);
	}
	if (o.count > 0) {
		amqp_basic_qos(conn, 1, 0, 200, 0);
		die_reply(amqp_get_rpc_reply(conn), "basic.qos");
		amqp_basic_consume(conn, 1, amqp_cstring_bytes(o.queue),
				   amqp_empty_bytes, 0, 0, 0, amqp_empty_table);
		die_reply(amqp_get_rpc_reply(conn), "basic.consume");
	}
	while (got < o.count) {
		struct timeval idle = {o.idle_s, 0};
		amqp_envelope_t env;
		amqp_rpc_reply_t r;
		int rc;

		amqp_maybe_release_buffers(conn);
		r = amqp_consume_message(conn, &env, &idle, 0);
		if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
		    (r.library_error == AMQP_STATUS_TIMEOUT ||
		     r.library_error == -AMQP_STATUS_TIMEOUT)) {
			fprintf(stderr,
				"amqp_consume: idle for %lds after %ld of %ld "
				"messages\n",
				o.idle_s, got, o.count);
			return 3;
		}
		die_reply(r, "consuming");
		print_message(&env);
		rc = amqp_basic_ack(conn, 1, env.delivery_tag, 0);
		amqp_destroy_envelope(&env);
		if (rc != AMQP_STATUS_OK) {
			fprintf(stderr, "amqp_consume: ack failed\n");
			return 1;
		}
		got++;
	}
	amqp_channel_close(conn, 1, AMQP_REPLY_SUCCESS);
	amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
	return 0;
}
