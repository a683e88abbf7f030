/* SPDX-License-Identifier: MIT */
/* Unit tests for the AMQP form of an event and the reading of broker
 * error texts (publishers/amqp_map.c); no broker needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include <amqp_tcp_socket.h>
#include <cJSON.h>

#include "publishers/amqp_map.h"
#include "publishers/publisher.h"

#define EV_ID "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
#define EV_TIME "2024-05-01T12:34:56.789000Z"
#define TRACEPARENT "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static const unsigned char body[] = "{\"orderId\":42}";

static struct outbox_event event(void)
{
	return (struct outbox_event){
	    .id = EV_ID,
	    .seq = 7,
	    .type = "com.example.order.created.v1",
	    .source = "urn:example:orders",
	    .subject = "order/42",
	    .content_type = "application/json",
	    .exchange = NULL,
	    .routing_key = "orders.created",
	    .partition_key = "order-42",
	    .payload = body,
	    .payload_len = sizeof(body) - 1,
	    .headers_json =
		"{\"traceparent\":\"" TRACEPARENT "\","
		"\"tracestate\":\"vendor=1\",\"x-tenant\":\"acme\"}",
	    .time = EV_TIME,
	    .created_at_us = 1714566896789000,
	    .attempts = 1,
	    .max_attempts = 10,
	};
}

/* The backend's settings of the config below; reset by config(). */
static struct rmq_settings settings;

static struct config config(void)
{
	settings = (struct rmq_settings){
	    .exchange = (char *)"events",
	    .header_prefix = (char *)"ce-",
	    .unroutable = UNROUTABLE_RETRY,
	};
	return (struct config){
	    .ce_mode = CE_MODE_BINARY,
	    .parts = {{&rmq_settings_group, &settings}},
	    .n_parts = 1,
	};
}

static bool bytes_eq(amqp_bytes_t b, const char *s)
{
	return b.len == strlen(s) && memcmp(b.bytes, s, b.len) == 0;
}

static void assert_bytes(amqp_bytes_t b, const char *s)
{
	if (!bytes_eq(b, s))
		fail_msg("expected \"%s\", got \"%.*s\"", s, (int)b.len,
			 (const char *)b.bytes);
}

/* The value of header name, or NULL; fails unless it is a long string. */
static const amqp_bytes_t *header(const struct rmq_msg *m, const char *name)
{
	const amqp_table_t *t = &m->props.headers;

	for (int i = 0; i < t->num_entries; i++) {
		if (!bytes_eq(t->entries[i].key, name))
			continue;
		assert_int_equal(t->entries[i].value.kind,
				 AMQP_FIELD_KIND_UTF8);
		return &t->entries[i].value.value.bytes;
	}
	return NULL;
}

static void assert_header(const struct rmq_msg *m, const char *name,
			  const char *value)
{
	const amqp_bytes_t *v = header(m, name);

	if (!v)
		fail_msg("header %s missing", name);
	assert_bytes(*v, value);
}

static void test_binary_mapping(void **unused)
{
	struct config cfg = config();
	struct outbox_event ev = event();
	struct rmq_msg m;
	char reason[256] = "";
	static const char *const order[] = {
	    "ce-specversion", "ce-id",	    "ce-source",       "ce-type",
	    "ce-time",	      "ce-subject", "ce-partitionkey", "traceparent",
	    "tracestate",     "x-tenant",
	};
	const amqp_basic_properties_t *p = &m.props;

	(void)unused;
	assert_int_equal(rmq_msg_build(&cfg, &ev, &m, reason, sizeof(reason)),
			 0);
	/* NULL exchange: the configured default. */
	assert_bytes(m.exchange, "events");
	assert_bytes(m.routing_key, "orders.created");
	/* The body is the payload itself, not a copy. */
	assert_ptr_equal(m.body.bytes, body);
	assert_int_equal(m.body.len, sizeof(body) - 1);

	assert_true(p->_flags & AMQP_BASIC_CONTENT_TYPE_FLAG);
	assert_bytes(p->content_type, "application/json");
	assert_true(p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG);
	assert_int_equal(p->delivery_mode, 2);
	assert_true(p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG);
	assert_bytes(p->message_id, EV_ID);
	assert_true(p->_flags & AMQP_BASIC_TIMESTAMP_FLAG);
	assert_int_equal(p->timestamp, 1714566896);
	assert_true(p->_flags & AMQP_BASIC_TYPE_FLAG);
	assert_bytes(p->type, "com.example.order.created.v1");
	assert_true(p->_flags & AMQP_BASIC_APP_ID_FLAG);
	assert_bytes(p->app_id, "outbox-relay");
	assert_false(p->_flags & AMQP_BASIC_EXPIRATION_FLAG);
	assert_false(p->_flags & AMQP_BASIC_PRIORITY_FLAG);

	assert_true(p->_flags & AMQP_BASIC_HEADERS_FLAG);
	assert_int_equal(p->headers.num_entries,
			 sizeof(order) / sizeof(order[0]));
	for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++)
		assert_bytes(p->headers.entries[i].key, order[i]);
	assert_header(&m, "ce-specversion", "1.0");
	assert_header(&m, "ce-id", EV_ID);
	assert_header(&m, "ce-source", "urn:example:orders");
	assert_header(&m, "ce-type", "com.example.order.created.v1");
	assert_header(&m, "ce-time", EV_TIME);
	assert_header(&m, "ce-subject", "order/42");
	assert_header(&m, "ce-partitionkey", "order-42");
	assert_header(&m, "traceparent", TRACEPARENT);
	assert_header(&m, "tracestate", "vendor=1");
	assert_header(&m, "x-tenant", "acme");
	/* datacontenttype travels as the basic property, not a header. */
	assert_null(header(&m, "ce-datacontenttype"));
	assert_null(header(&m, "content-type"));
	rmq_msg_release(&m);
	assert_null(m.entries);
	assert_int_equal(m.props.headers.num_entries, 0);
}

static void test_prefix_cloudevents(void **unused)
{
	struct config cfg = config();
	struct outbox_event ev = event();
	struct rmq_msg m;
	char reason[256];

	(void)unused;
	settings.header_prefix = (char *)"cloudEvents_";
	assert_int_equal(rmq_msg_build(&cfg, &ev, &m, reason, sizeof(reason)),
			 0);
	assert_header(&m, "cloudEvents_specversion", "1.0");
	assert_header(&m, "cloudEvents_id", EV_ID);
	assert_header(&m, "cloudEvents_type", "com.example.order.created.v1");
	assert_null(header(&m, "ce-id"));
	assert_header(&m, "traceparent", TRACEPARENT);
	rmq_msg_release(&m);
}

static void test_optional_attributes(void **unused)
{
	struct config cfg = config();
	struct outbox_event ev = event();
	struct rmq_msg m;
	char reason[256];

	(void)unused;
	ev.exchange = ""; /* the real default exchange, not the config's */
	ev.routing_key = "";
	ev.subject = NULL;
	ev.partition_key = "";
	ev.content_type = NULL;
	ev.headers_json = NULL;
	ev.created_at_us = 1999999; /* 1.999999 s: seconds, truncated */
	assert_int_equal(rmq_msg_build(&cfg, &ev, &m, reason, sizeof(reason)),
			 0);
	assert_bytes(m.exchange, "");
	assert_bytes(m.routing_key, "");
	assert_false(m.props._flags & AMQP_BASIC_CONTENT_TYPE_FLAG);
	assert_int_equal(m.props.timestamp, 1);
	assert_null(header(&m, "ce-subject"));
	assert_null(header(&m, "ce-partitionkey"));
	assert_int_equal(m.props.headers.num_entries, 5);
	rmq_msg_release(&m);

	/* No configured exchange: NULL goes to the default exchange. */
	settings.exchange = NULL;
	ev.exchange = NULL;
	assert_int_equal(rmq_msg_build(&cfg, &ev, &m, reason, sizeof(reason)),
			 0);
	assert_bytes(m.exchange, "");
	rmq_msg_release(&m);
}

static void test_structured_mapping(void **unused)
{
	struct config cfg = config();
	struct outbox_event ev = event();
	struct rmq_msg m;
	char reason[256];
	cJSON *doc;

	(void)unused;
	cfg.ce_mode = CE_MODE_STRUCTURED;
	assert_int_equal(rmq_msg_build(&cfg, &ev, &m, reason, sizeof(reason)),
			 0);
	assert_bytes(m.props.content_type,
		     "application/cloudevents+json; charset=UTF-8");
	assert_int_equal(m.props.delivery_mode, 2);
	assert_bytes(m.props.message_id, EV_ID);
	/* Only the row's transport headers: attributes are in the body. */
	assert_int_equal(m.props.headers.num_entries, 3);
	assert_header(&m, "traceparent", TRACEPARENT);
	assert_header(&m, "tracestate", "vendor=1");
	assert_header(&m, "x-tenant", "acme");
	assert_null(header(&m, "ce-id"));

	doc = cJSON_ParseWithLength(m.body.bytes, m.body.len);
	assert_non_null(doc);
	assert_string_equal(
	    cJSON_GetStringValue(cJSON_GetObjectItem(doc, "specversion")),
	    "1.0");
	assert_string_equal(
	    cJSON_GetStringValue(cJSON_GetObjectItem(doc, "id")), EV_ID);
	assert_string_equal(
	    cJSON_GetStringValue(cJSON_GetObjectItem(doc, "datacontenttype")),
	    "application/json");
	assert_string_equal(
	    cJSON_GetStringValue(cJSON_GetObjectItem(doc, "traceparent")),
	    TRACEPARENT);
	assert_int_equal(
	    cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "data"), "orderId")
		->valueint,
	    42);
	cJSON_Delete(doc);
	rmq_msg_release(&m);

	/* No row headers: no header table at all. */
	ev.headers_json = "{}";
	assert_int_equal(rmq_msg_build(&cfg, &ev, &m, reason, sizeof(reason)),
			 0);
	assert_false(m.props._flags & AMQP_BASIC_HEADERS_FLAG);
	rmq_msg_release(&m);
}

static char *repeat(char c, size_t n)
{
	char *s = malloc(n + 1);

	assert_non_null(s);
	memset(s, c, n);
	s[n] = '\0';
	return s;
}

static void assert_build_fails(const struct config *cfg,
			       const struct outbox_event *ev,
			       const char *expect)
{
	struct rmq_msg m;
	char reason[256] = "";

	assert_int_equal(rmq_msg_build(cfg, ev, &m, reason, sizeof(reason)),
			 -1);
	if (!strstr(reason, expect))
		fail_msg("reason \"%s\" lacks \"%s\"", reason, expect);
	/* Left empty, and releasing it again is harmless. */
	assert_null(m.entries);
	assert_null(m.ce.items);
	assert_null(m.structured);
	rmq_msg_release(&m);
}

static void test_refused_rows(void **unused)
{
	struct config cfg = config();
	struct outbox_event ev = event();
	char *longname = repeat('k', 256);
	char *json;

	(void)unused;
	ev.routing_key = longname;
	assert_build_fails(&cfg, &ev, "routing key");
	ev = event();
	ev.exchange = longname;
	assert_build_fails(&cfg, &ev, "exchange");
	ev = event();
	/* A media type, too long for an AMQP short string. */
	char *longtype = repeat('k', 256);
	memcpy(longtype, "application/", 12);
	ev.content_type = longtype;
	assert_build_fails(&cfg, &ev, "content type");
	free(longtype);

	ev = event();
	json = malloc(300 + 32);
	assert_non_null(json);
	snprintf(json, 332, "{\"%s\":\"v\"}", longname);
	ev.headers_json = json;
	assert_build_fails(&cfg, &ev, "header name");
	free(json);

	/* RabbitMQ's routing headers, by their exact names only. */
	ev = event();
	ev.headers_json = "{\"CC\":\"k.other\"}";
	assert_build_fails(&cfg, &ev, "header CC: RabbitMQ reads CC and BCC");
	ev.headers_json = "{\"BCC\":\"k.other\"}";
	assert_build_fails(&cfg, &ev, "header BCC:");
	ev.headers_json = "{\"cc\":\"k.other\",\"CCX\":\"v\"}";
	{
		struct rmq_msg m;
		char reason[256];

		assert_int_equal(
		    rmq_msg_build(&cfg, &ev, &m, reason, sizeof(reason)), 0);
		assert_header(&m, "cc", "k.other");
		rmq_msg_release(&m);
	}

	/* What cloudevent_validate() refuses, with its reason. */
	ev = event();
	ev.type = "";
	assert_build_fails(&cfg, &ev, "empty type");
	ev = event();
	ev.headers_json = "{\"ce-id\":\"spoof\"}";
	assert_build_fails(&cfg, &ev, "collides");
	cfg.ce_mode = CE_MODE_STRUCTURED;
	assert_build_fails(&cfg, &ev, "collides");

	/* Long id or type: the property is left out, the header stays. */
	cfg.ce_mode = CE_MODE_BINARY;
	ev = event();
	ev.type = longname;
	{
		struct rmq_msg m;
		char reason[256];

		assert_int_equal(
		    rmq_msg_build(&cfg, &ev, &m, reason, sizeof(reason)), 0);
		assert_false(m.props._flags & AMQP_BASIC_TYPE_FLAG);
		assert_header(&m, "ce-type", longname);
		rmq_msg_release(&m);
	}
	free(longname);
}

/*
 * The computed size of the content-header frame against what librabbitmq
 * really writes: publish to a loopback listener and measure the frame.
 */
static size_t wire_header_frame_size(const struct rmq_msg *m)
{
	struct sockaddr_in addr = {.sin_family = AF_INET};
	socklen_t alen = sizeof(addr);
	amqp_connection_state_t conn;
	amqp_socket_t *sock;
	unsigned char *buf;
	size_t cap = 1 << 20, got = 0, at = 0, size = 0;
	int lfd, cfd;

	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(lfd >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&addr, sizeof(addr)), 0);
	assert_int_equal(listen(lfd, 1), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&addr, &alen), 0);

	conn = amqp_new_connection();
	sock = amqp_tcp_socket_new(conn);
	assert_non_null(sock);
	assert_int_equal(
	    amqp_socket_open(sock, "127.0.0.1", ntohs(addr.sin_port)),
	    AMQP_STATUS_OK);
	cfd = accept(lfd, NULL, NULL);
	assert_true(cfd >= 0);
	assert_int_equal(amqp_basic_publish(conn, 1, m->exchange,
					    m->routing_key, 1, 0, &m->props,
					    m->body),
			 AMQP_STATUS_OK);
	amqp_destroy_connection(conn);

	buf = malloc(cap);
	assert_non_null(buf);
	for (;;) {
		ssize_t r = read(cfd, buf + got, cap - got);

		assert_true(r >= 0);
		if (r == 0)
			break;
		got += (size_t)r;
	}
	/* Frames: type(1) channel(2) size(4) payload frame-end(1). */
	while (at + 7 <= got) {
		uint32_t len = (uint32_t)buf[at + 3] << 24 |
			       (uint32_t)buf[at + 4] << 16 |
			       (uint32_t)buf[at + 5] << 8 | buf[at + 6];

		if (buf[at] == AMQP_FRAME_HEADER) {
			size = 7 + (size_t)len + 1;
			break;
		}
		at += 7 + (size_t)len + 1;
	}
	free(buf);
	close(cfd);
	close(lfd);
	return size;
}

static void test_header_frame_size(void **unused)
{
	struct config cfg = config();
	struct outbox_event ev = event();
	struct rmq_msg m;
	char reason[256];
	size_t size;

	(void)unused;
	assert_int_equal(rmq_msg_build(&cfg, &ev, &m, reason, sizeof(reason)),
			 0);
	size = rmq_msg_header_frame_size(&m);
	assert_int_equal(size, wire_header_frame_size(&m));
	assert_int_equal(rmq_msg_check_fit(&m, size, reason, sizeof(reason)),
			 0);
	assert_int_equal(rmq_msg_check_fit(&m, 0, reason, sizeof(reason)), 0);
	assert_int_equal(
	    rmq_msg_check_fit(&m, size - 1, reason, sizeof(reason)), -1);
	assert_non_null(strstr(reason, "headers too large"));
	assert_non_null(strstr(reason, "frame_max"));
	rmq_msg_release(&m);

	/* Structured mode, no headers, no content type in binary mode. */
	cfg.ce_mode = CE_MODE_STRUCTURED;
	ev.headers_json = NULL;
	assert_int_equal(rmq_msg_build(&cfg, &ev, &m, reason, sizeof(reason)),
			 0);
	assert_int_equal(rmq_msg_header_frame_size(&m),
			 wire_header_frame_size(&m));
	rmq_msg_release(&m);
	cfg.ce_mode = CE_MODE_BINARY;
	ev.content_type = NULL;
	assert_int_equal(rmq_msg_build(&cfg, &ev, &m, reason, sizeof(reason)),
			 0);
	assert_int_equal(rmq_msg_header_frame_size(&m),
			 wire_header_frame_size(&m));
	rmq_msg_release(&m);
}

static void parse(uint16_t code, const char *text, struct rmq_refusal *r)
{
	rmq_refusal_parse(code, text, strlen(text), r);
}

static void test_refusal_parse(void **unused)
{
	struct rmq_refusal r;

	(void)unused;
	parse(404, "NOT_FOUND - no exchange 'nope' in vhost '/'", &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_EXCHANGE);
	assert_string_equal(r.exchange, "nope");

	parse(403,
	      "ACCESS_REFUSED - access to exchange 'amq.direct' in vhost '/' "
	      "refused for user 'limited'",
	      &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_EXCHANGE);
	assert_string_equal(r.exchange, "amq.direct");

	/* The default exchange is named amq.default in texts. */
	parse(403,
	      "ACCESS_REFUSED - access to exchange 'amq.default' in vhost "
	      "'/' refused for user 'limited'",
	      &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_EXCHANGE);
	assert_string_equal(r.exchange, "");

	parse(403,
	      "ACCESS_REFUSED - access to topic 'bad.key' in exchange "
	      "'amq.topic' in vhost '/' refused for user 'limited'",
	      &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_ROUTE);
	assert_string_equal(r.exchange, "amq.topic");
	assert_string_equal(r.routing_key, "bad.key");

	/* A quote inside the name: the name ends at the last closer. */
	parse(404, "NOT_FOUND - no exchange 'it's' in vhost 'v'", &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_EXCHANGE);
	assert_string_equal(r.exchange, "it's");

	parse(406,
	      "PRECONDITION_FAILED - message size 2000000 is larger than "
	      "configured max size 1048576",
	      &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_TOO_LARGE);
	assert_int_equal(r.max_size, 1048576);

	/* Everything else names nothing. */
	parse(406, "PRECONDITION_FAILED - unknown delivery tag 7", &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_OTHER);
	parse(406, "PRECONDITION_FAILED - message size 12 is larger than", &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_OTHER);
	parse(404, "NOT_FOUND - no queue 'q' in vhost '/'", &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_OTHER);
	parse(404, "NOT_FOUND - no exchange 'cut", &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_OTHER);
	parse(403, "ACCESS_REFUSED - access to topic 'k' in exch", &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_OTHER);
	parse(541, "INTERNAL_ERROR", &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_OTHER);
	rmq_refusal_parse(404, NULL, 0, &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_OTHER);
	/* The text is not NUL-terminated: only len bytes count. */
	rmq_refusal_parse(404, "NOT_FOUND - no exchange 'x' in vhost '/'", 20,
			  &r);
	assert_int_equal(r.kind, RMQ_REFUSAL_OTHER);
}

static void test_quote(void **unused)
{
	char out[32];
	/* "é" is two bytes: a cut must not split it. */
	const char *s = "ab\xc3\xa9\xc3\xa9\xc3\xa9";

	(void)unused;
	cloudevent_quote(out, sizeof(out), "a'b\"c\\d\ne\x7f", 10, 20);
	assert_string_equal(out, "a'b?c?d?e?");
	cloudevent_quote(out, sizeof(out), s, strlen(s), 5);
	assert_string_equal(out, "ab\xc3\xa9...");
	cloudevent_quote(out, sizeof(out), "\xff\xfe", 2, 20);
	assert_string_equal(out, "??");
	/* max is capped by the buffer. */
	cloudevent_quote(out, 8, "abcdefghijkl", 12, 100);
	assert_string_equal(out, "abcd...");

	/* Cuts that split a character drop it; whole ones stay. */
	snprintf(out, sizeof(out), "%s", "ab\xc3");
	rmq_map_utf8_cut(out);
	assert_string_equal(out, "ab");
	snprintf(out, sizeof(out), "%s", "ab\xe2\x82");
	rmq_map_utf8_cut(out);
	assert_string_equal(out, "ab");
	snprintf(out, sizeof(out), "%s", "ab\xe2\x82\xac");
	rmq_map_utf8_cut(out);
	assert_string_equal(out, "ab\xe2\x82\xac");
	snprintf(out, sizeof(out), "%s", "ab\xf0\x9f\x98");
	rmq_map_utf8_cut(out);
	assert_string_equal(out, "ab");
	snprintf(out, sizeof(out), "%s", "abc");
	rmq_map_utf8_cut(out);
	assert_string_equal(out, "abc");
	out[0] = '\0';
	rmq_map_utf8_cut(out);
	assert_string_equal(out, "");
}

/* What an RPC reply says, for the publisher's reasons and the test
 * programs' errors alike. */
static void test_describe_reply(void **unused)
{
	(void)unused;
	char out[256];
	amqp_rpc_reply_t r = {.reply_type = AMQP_RESPONSE_NORMAL};
	rmq_map_describe_reply(r, out, sizeof(out));
	assert_string_equal(out, "ok");

	/* librabbitmq negates the status in some paths, not in others. */
	r.reply_type = AMQP_RESPONSE_LIBRARY_EXCEPTION;
	r.library_error = AMQP_STATUS_SOCKET_ERROR;
	rmq_map_describe_reply(r, out, sizeof(out));
	assert_string_equal(out, amqp_error_string2(AMQP_STATUS_SOCKET_ERROR));
	r.library_error = -AMQP_STATUS_SOCKET_ERROR;
	rmq_map_describe_reply(r, out, sizeof(out));
	assert_string_equal(out, amqp_error_string2(AMQP_STATUS_SOCKET_ERROR));

	/* The broker's text is quoted: a control character cannot reach a
	 * log line or last_error. */
	amqp_channel_close_t close = {
	    .reply_code = 404,
	    .reply_text = amqp_cstring_bytes("NOT_FOUND - no\nexchange")};
	r.reply_type = AMQP_RESPONSE_SERVER_EXCEPTION;
	r.reply.id = AMQP_CHANNEL_CLOSE_METHOD;
	r.reply.decoded = &close;
	rmq_map_describe_reply(r, out, sizeof(out));
	assert_string_equal(out, "404 NOT_FOUND - no?exchange");
}

/* The test is linked with --wrap=explicit_bzero (and its fortified
 * form, which builds with _FORTIFY_SOURCE call instead): each wipe of a
 * copy of the broker's URL (it still starts with the scheme) is counted
 * when it covers the whole URL. amqp_parse_url() cuts its copy with
 * NULs, so a wipe of strlen(copy) bytes stops before the password. */
#define SECRET_URL "amqp://relay:s3cret-password@127.0.0.1:1/vh"
static int whole_url_wipes, short_url_wipes;

static void count_wipe(const void *p, size_t n)
{
	if (n >= 4 && memcmp(p, "amqp", 4) == 0) {
		if (n >= strlen(SECRET_URL))
			whole_url_wipes++;
		else
			short_url_wipes++;
	}
}

void __real_explicit_bzero(void *p, size_t n);
void __wrap_explicit_bzero(void *p, size_t n);
void __wrap_explicit_bzero(void *p, size_t n)
{
	count_wipe(p, n);
	__real_explicit_bzero(p, n);
}

void __real___explicit_bzero_chk(void *p, size_t n, size_t size);
void __wrap___explicit_bzero_chk(void *p, size_t n, size_t size);
void __wrap___explicit_bzero_chk(void *p, size_t n, size_t size)
{
	count_wipe(p, n);
	__real___explicit_bzero_chk(p, n, size);
}

static void test_url_copies_wiped_whole(void **unused)
{
	(void)unused;
	char err[256];
	struct config cfg = config();
	settings.url = (char *)SECRET_URL;
	settings.tls_verify = true;

	/* The settings' check parses a copy and wipes it. */
	whole_url_wipes = short_url_wipes = 0;
	assert_int_equal(rmq_settings_check(&settings, err, sizeof(err)), 0);
	assert_int_equal(whole_url_wipes, 1);
	assert_int_equal(short_url_wipes, 0);

	/* The publisher keeps a parsed copy; freed when its open fails (no
	 * broker listens on port 1), it is wiped whole too. */
	struct publisher pub;
	publisher_init(&pub, publisher_find("amqp"));
	assert_non_null(pub.ops);
	whole_url_wipes = short_url_wipes = 0;
	assert_int_equal(publisher_open(&pub, &cfg, err, sizeof(err)), -1);
	assert_true(whole_url_wipes >= 2); /* the check's copy, the state's */
	assert_int_equal(short_url_wipes, 0);
	assert_null(strstr(err, "s3cret"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_binary_mapping),
	    cmocka_unit_test(test_prefix_cloudevents),
	    cmocka_unit_test(test_optional_attributes),
	    cmocka_unit_test(test_structured_mapping),
	    cmocka_unit_test(test_refused_rows),
	    cmocka_unit_test(test_header_frame_size),
	    cmocka_unit_test(test_refusal_parse),
	    cmocka_unit_test(test_quote),
	    cmocka_unit_test(test_describe_reply),
	    cmocka_unit_test(test_url_copies_wiped_whole),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
