/* SPDX-License-Identifier: MIT */
/* Unit tests for the CloudEvents encoding (src/encode/cloudevent.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cJSON.h>

#include "encode/encode.h"
#include "encode/encode_test.h"

#define EV_ID "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
#define EV_TIME "2024-05-01T12:34:56.789000Z"
#define TRACEPARENT "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

/* The payload lives in an exact-size heap block so ASan catches any read
 * past payload_len (the payload is not NUL-terminated). */
struct fixture {
	struct outbox_event ev;
	unsigned char *payload;
};

static void fixture_payload(struct fixture *f, const void *bytes, size_t n)
{
	free(f->payload);
	f->payload = malloc(n ? n : 1);
	assert_non_null(f->payload);
	if (n)
		memcpy(f->payload, bytes, n);
	f->ev.payload = f->payload;
	f->ev.payload_len = n;
}

static void fixture_init(struct fixture *f)
{
	static const char body[] = "{\"orderId\":42}";

	memset(f, 0, sizeof(*f));
	f->ev = (struct outbox_event){
	    .id = EV_ID,
	    .seq = 7,
	    .type = "com.example.order.created.v1",
	    .source = "urn:example:orders",
	    .subject = "order/42",
	    .content_type = "application/json",
	    .exchange = NULL,
	    .routing_key = "orders",
	    .partition_key = "order-42",
	    .headers_json = "{}",
	    .time = EV_TIME,
	    .created_at_us = 1714566896789000,
	    .attempts = 1,
	    .max_attempts = 10,
	};
	fixture_payload(f, body, strlen(body));
}

static void fixture_release(struct fixture *f)
{
	free(f->payload);
	f->payload = NULL;
}

/* ---- validation ---------------------------------------------------- */

/* A field left NULL in a case keeps the fixture's value; SET_NULL sets it
 * to NULL. */
static const char set_null[] = "<null>";
#define SET_NULL set_null

struct vcase {
	const char *what;
	const char *id, *type, *source, *subject, *partition_key, *content_type,
	    *headers, *exchange, *routing_key;
	const char *want; /* NULL: valid; else the exact reason */
};

/* Names longer than the reason quotes: 64 bytes, then "...". */
#define A10 "aaaaaaaaaa"

static const struct vcase vcases[] = {
    /* bad rows */
    {"empty type", .type = "", .want = "empty type"},
    {"null type", .type = SET_NULL, .want = "empty type"},
    {"empty source", .source = "", .want = "empty source"},
    {"empty id", .id = "", .want = "empty id"},
    {"headers array", .headers = "[\"a\"]",
     .want = "headers are not a json object"},
    {"headers string", .headers = "\"x\"",
     .want = "headers are not a json object"},
    {"headers unparseable", .headers = "{",
     .want = "headers are not valid json"},
    {"headers empty text", .headers = "", .want = "headers are not valid json"},
    {"headers trailing garbage", .headers = "{\"a\":\"b\"} x",
     .want = "headers are not valid json"},
    {"number value", .headers = "{\"x-n\":1}",
     .want = "header \"x-n\" is not a string"},
    {"null value", .headers = "{\"a\":null}",
     .want = "header \"a\" is not a string"},
    {"object value", .headers = "{\"a\":{}}",
     .want = "header \"a\" is not a string"},
    {"empty name", .headers = "{\"\":\"x\"}", .want = "empty header name"},
    {"ce- prefix", .headers = "{\"ce-id\":\"spoof\"}",
     .want = "header \"ce-id\" collides with a CloudEvents attribute"},
    {"ce_ prefix upper", .headers = "{\"CE_ID\":\"spoof\"}",
     .want = "header \"CE_ID\" collides with a CloudEvents attribute"},
    {"ce_ extension", .headers = "{\"x\":\"1\",\"ce_foo\":\"spoof\"}",
     .want = "header \"ce_foo\" collides with a CloudEvents attribute"},
    {"cloudEvents_", .headers = "{\"cloudEvents_id\":\"spoof\"}",
     .want = "header \"cloudEvents_id\" collides with a CloudEvents "
	     "attribute"},
    {"cloudevents: any case", .headers = "{\"CLOUDEVENTS:type\":\"x\"}",
     .want = "header \"CLOUDEVENTS:type\" collides with a CloudEvents "
	     "attribute"},
    {"bare cloudevents", .headers = "{\"cloudevents\":\"x\"}",
     .want = "header \"cloudevents\" collides with a CloudEvents "
	     "attribute"},
    {"content-type", .headers = "{\"Content-Type\":\"text/plain\"}",
     .want = "header \"Content-Type\" collides with the content type the "
	     "relay writes"},
    {"duplicate header", .headers = "{\"a\":\"1\",\"a\":\"2\"}",
     .want = "duplicate header \"a\""},
    {"duplicate header apart",
     .headers = "{\"b\":\"1\",\"c\":\"2\",\"a\":\"3\",\"b\":\"4\"}",
     .want = "duplicate header \"b\""},
    {"newline in header name", .headers = "{\"a\\nb\":\"x\"}",
     .want = "header name \"a?b\" contains a control character"},
    {"invalid utf-8 header name", .headers = "{\"x-\xff\":\"v\"}",
     .want = "header name \"x-?\" is not valid utf-8"},
    {"quote in colliding name", .headers = "{\"ce-\\\"x\":\"v\"}",
     .want = "header \"ce-?x\" collides with a CloudEvents attribute"},
    {"invalid utf-8 header value", .headers = "{\"x-a\":\"\xc3\"}",
     .want = "header \"x-a\" value is not valid utf-8"},
    {"control in traceparent", .headers = "{\"traceparent\":\"00\\u0001\"}",
     .want = "header \"traceparent\" value contains a control character"},
    {"newline in type", .type = "a\nb",
     .want = "type contains a control character"},
    {"control in source", .source = "urn:\x01",
     .want = "source contains a control character"},
    {"DEL in subject", .subject = "order\x7f",
     .want = "subject contains a control character"},
    {"C1 control in partition key", .partition_key = "k\xc2\x85",
     .want = "partition_key contains a control character"},
    {"tab in id", .id = "a\tb", .want = "id contains a control character"},
    {"newline in content type", .content_type = "application/json\r\n",
     .want = "content_type contains a control character"},
    /* datacontenttype is an RFC 2046 media type */
    {"content type without subtype", .content_type = "json",
     .want = "content_type is not a media type (type/subtype, RFC 2046)"},
    {"space in content type", .content_type = "application json",
     .want = "content_type is not a media type (type/subtype, RFC 2046)"},
    {"empty subtype", .content_type = "text/",
     .want = "content_type is not a media type (type/subtype, RFC 2046)"},
    {"junk after subtype", .content_type = "text/plain charset=utf-8",
     .want = "content_type is not a media type (type/subtype, RFC 2046)"},
    {"cloudevents content type", .content_type = "Application/CloudEvents+json",
     .want = "content_type is application/cloudevents, which a consumer "
	     "reads as a whole event (structured mode): give the payload's "
	     "own type"},
    /* \u0000 in headers (json or text columns of tables made by hand) */
    {"nul in a header value", .headers = "{\"x-a\":\"b\\u0000c\"}",
     .want = "headers contain a NUL character (\\u0000)"},
    /* cJSON reads a \u without four hex digits as \u0000 */
    {"bad u escape in a header", .headers = "{\"x-a\":\"ab\\uzzzzcd\"}",
     .want = "headers are not valid json (\\u not followed by four hex "
	     "digits)"},
    {"u escape cut short", .headers = "{\"x-a\":\"\\u12\"}",
     .want = "headers are not valid json (\\u not followed by four hex "
	     "digits)"},
    {"invalid utf-8 subject", .subject = "\xff",
     .want = "subject is not valid utf-8"},
    {"overlong utf-8 type", .type = "\xc0\xaf",
     .want = "type is not valid utf-8"},
    {"surrogate in type", .type = "\xed\xa0\x80",
     .want = "type is not valid utf-8"},
    {"noncharacter in type", .type = "t\xef\xb7\x90",
     .want = "type contains a unicode noncharacter"},
    {"long header name quoted short",
     .headers = "{\"ce-" A10 A10 A10 A10 A10 A10 A10 A10 "\":\"x\"}",
     .want = "header \"ce-" A10 A10 A10 A10 A10 A10 "a...\" collides with "
	     "a CloudEvents attribute"},
    /* source must be an RFC 3986 URI-reference */
    {"source with spaces", .source = "not a uri with spaces",
     .want = "source is not a URI-reference (RFC 3986): a space in the path"},
    {"space in host", .source = "https://exa mple.com/x",
     .want = "source is not a URI-reference (RFC 3986): a space in the host"},
    {"bad scheme", .source = "1abc:x",
     .want = "source is not a URI-reference (RFC 3986): an invalid scheme"},
    {"colon first", .source = ":x",
     .want = "source is not a URI-reference (RFC 3986): an invalid scheme"},
    {"bad percent", .source = "urn:a%zz",
     .want = "source is not a URI-reference (RFC 3986): a '%' not followed "
	     "by two hex digits in the path"},
    {"cut percent", .source = "/a%4",
     .want = "source is not a URI-reference (RFC 3986): a '%' not followed "
	     "by two hex digits in the path"},
    {"port not a number", .source = "http://host:80a/",
     .want = "source is not a URI-reference (RFC 3986): a port that is not "
	     "a number"},
    {"unclosed ip literal", .source = "http://[::1/x",
     .want = "source is not a URI-reference (RFC 3986): an unclosed '[' in "
	     "the host"},
    {"second fragment", .source = "/a#b#c",
     .want = "source is not a URI-reference (RFC 3986): '#' in the "
	     "fragment"},
    {"bracket in path", .source = "/a[b]",
     .want = "source is not a URI-reference (RFC 3986): '[' in the path"},
    {"non-ascii source", .source = "/Ã©tÃ©",
     .want = "source is not a URI-reference (RFC 3986): a non-ASCII byte in "
	     "the path (percent-encode it)"},
    {"quote in query", .source = "/a?b=\"c\"",
     .want = "source is not a URI-reference (RFC 3986): '\"' in the query"},
    /* destinations without control characters (rows made without 004) */
    {"newline in exchange", .exchange = "orders\nforged",
     .want = "exchange contains a control character"},
    {"DEL in routing key", .routing_key = "rk\x7f",
     .want = "routing_key contains a control character"},
    {"escape in exchange", .exchange = "\x1b[31m",
     .want = "exchange contains a control character"},
    /* good rows */
    {"defaults", .want = NULL},
    {"relative source", .source = "/outbox-relay"},
    {"relative path source", .source = "orders/eu-1"},
    {"network-path source", .source = "//relay.example/orders"},
    {"full uri source",
     .source = "https://user:pw@example.com:8443/a/b;p?x=1&y=%2F#frag/?"},
    {"ip literal source", .source = "http://[2001:db8::1]:80/x"},
    {"mailto source", .source = "mailto:events@example.com"},
    {"urn source", .source = "urn:uuid:0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"},
    {"sub-delims source", .source = "/a!$&'()*+,;=:@b~_.-"},
    {"empty exchange and routing key", .exchange = "", .routing_key = ""},
    {"dotted destinations", .exchange = "orders.v1",
     .routing_key = "order.paid.*"},
    {"null headers", .headers = SET_NULL},
    {"no subject, no key", .subject = SET_NULL, .partition_key = SET_NULL},
    {"empty subject and key mean absent", .subject = "", .partition_key = ""},
    {"x- headers pass", .headers = "{\"x-match\":\"all\",\"x-tenant\":"
				   "\"acme\"}"},
    {"trace context passes",
     .headers = "{\"traceparent\":\"" TRACEPARENT
		"\",\"tracestate\":\"rojo=00f067aa0ba902b7\"}"},
    {"near misses pass", .headers = "{\"ce\":\"1\",\"cex\":\"2\",\"c\":"
				    "\"3\",\"content-type-x\":\"4\","
				    "\"cloud\":\"5\",\"X-Ce-Id\":\"6\"}"},
    {"control chars in plain header values pass",
     .headers = "{\"x-note\":\"line1\\nline2\"}"},
    {"unicode", .subject = "bestellung/\xc3\xbc\xf0\x9f\x93\xa6",
     .headers = "{\"x-name\":\"\xc3\xa9t\xc3\xa9\"}"},
    {"unknown content type", .content_type = ""},
    {"content type with parameters",
     .content_type = "text/plain; charset=utf-8"},
    {"vendor content type", .content_type = "application/vnd.acme.order+json"},
    {"escaped backslash before u0000", .headers = "{\"x-a\":\"b\\\\u0000c\"}"},
};

static const char *pick(const char *override, const char *fallback)
{
	if (!override)
		return fallback;
	return override == set_null ? NULL : override;
}

static void test_validate_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(vcases) / sizeof(vcases[0]); i++) {
		const struct vcase *c = &vcases[i];
		struct fixture f;
		struct ce_headers h = {0};
		char reason[256] = "";
		char reason2[256] = "";
		char *env;
		size_t len = 99;
		int rc;

		fixture_init(&f);
		f.ev.id = pick(c->id, f.ev.id);
		f.ev.type = pick(c->type, f.ev.type);
		f.ev.source = pick(c->source, f.ev.source);
		f.ev.subject = pick(c->subject, f.ev.subject);
		f.ev.partition_key = pick(c->partition_key, f.ev.partition_key);
		f.ev.content_type = pick(c->content_type, f.ev.content_type);
		f.ev.headers_json = pick(c->headers, f.ev.headers_json);
		f.ev.exchange = pick(c->exchange, f.ev.exchange);
		f.ev.routing_key = pick(c->routing_key, f.ev.routing_key);

		rc = cloudevent_validate(&f.ev, reason, sizeof(reason));
		print_message("case: %s -> %d %s\n", c->what, rc, reason);
		if (!c->want) {
			assert_int_equal(rc, 0);
		} else {
			assert_int_equal(rc, -1);
			assert_string_equal(reason, c->want);
		}

		/* The encoders refuse exactly what validate refuses, with the
		 * same reason. */
		rc = cloudevent_binary_headers(&f.ev, "ce-", &h, reason2,
					       sizeof(reason2));
		assert_int_equal(rc, c->want ? -1 : 0);
		if (c->want) {
			assert_string_equal(reason2, c->want);
			assert_null(h.items);
			assert_int_equal(h.n, 0);
		}
		ce_headers_release(&h);

		reason2[0] = '\0';
		env = cloudevent_structured(&f.ev, &len, reason2,
					    sizeof(reason2));
		if (c->want) {
			assert_null(env);
			assert_int_equal(len, 0);
			assert_string_equal(reason2, c->want);
		} else {
			assert_non_null(env);
		}
		free(env);
		fixture_release(&f);
	}
}

static void test_validate_null_reason(void **state)
{
	struct fixture f;

	(void)state;
	fixture_init(&f);
	f.ev.type = "";
	assert_int_equal(cloudevent_validate(&f.ev, NULL, 0), -1);
	fixture_release(&f);
}

/* What OUTBOX_MAX_EVENT_SIZE counts: payload, headers and every attribute
 * the row supplies (not the id and time, of fixed size); an absent one
 * counts nothing, and the destination (exchange, routing key) is not the
 * event's. */
static void test_row_bytes(void **state)
{
	struct fixture f;

	(void)state;
	fixture_init(&f);
	size_t want = strlen("{\"orderId\":42}") + strlen("{}") +
		      strlen("com.example.order.created.v1") +
		      strlen("urn:example:orders") + strlen("order/42") +
		      strlen("application/json") + strlen("order-42");
	assert_int_equal(cloudevent_row_bytes(&f.ev), want);
	f.ev.subject = NULL;
	f.ev.partition_key = NULL;
	f.ev.exchange = "x";
	f.ev.routing_key = "a much longer routing key";
	f.ev.headers_json = "{\"traceparent\":\"00-ab\"}";
	want += strlen("{\"traceparent\":\"00-ab\"}") - strlen("{}") -
		strlen("order/42") - strlen("order-42");
	assert_int_equal(cloudevent_row_bytes(&f.ev), want);
	fixture_release(&f);
}

/* ---- binary mode --------------------------------------------------- */

struct kv {
	const char *name, *value;
};

static void assert_headers(const struct ce_headers *h, const struct kv *want,
			   size_t n)
{
	assert_int_equal(h->n, n);
	for (size_t i = 0; i < n; i++) {
		assert_string_equal(h->items[i].name, want[i].name);
		assert_string_equal(h->items[i].value, want[i].value);
	}
}

static void test_binary_amqp_ce_dash(void **state)
{
	struct fixture f;
	struct ce_headers h;
	char reason[256] = "";
	const struct kv want[] = {
	    {"ce-specversion", "1.0"},
	    {"ce-id", EV_ID},
	    {"ce-source", "urn:example:orders"},
	    {"ce-type", "com.example.order.created.v1"},
	    {"ce-time", EV_TIME},
	    {"ce-subject", "order/42"},
	    {"ce-partitionkey", "order-42"},
	    {"x-tenant", "acme"},
	    {"traceparent", TRACEPARENT},
	    {"tracestate", "rojo=00f067aa0ba902b7"},
	};

	(void)state;
	fixture_init(&f);
	f.ev.headers_json =
	    "{\"x-tenant\":\"acme\",\"traceparent\":\"" TRACEPARENT
	    "\",\"tracestate\":\"rojo=00f067aa0ba902b7\"}";
	assert_int_equal(
	    cloudevent_binary_headers(&f.ev, "ce-", &h, reason, sizeof(reason)),
	    0);
	assert_headers(&h, want, sizeof(want) / sizeof(want[0]));
	ce_headers_release(&h);
	assert_null(h.items);
	assert_int_equal(h.n, 0);
	fixture_release(&f);
}

static void test_binary_amqp_cloudevents_prefix(void **state)
{
	struct fixture f;
	struct ce_headers h;
	char reason[256] = "";
	const struct kv want[] = {
	    {"cloudEvents_specversion", "1.0"},
	    {"cloudEvents_id", EV_ID},
	    {"cloudEvents_source", "urn:example:orders"},
	    {"cloudEvents_type", "com.example.order.created.v1"},
	    {"cloudEvents_time", EV_TIME},
	};

	(void)state;
	fixture_init(&f);
	/* No subject, an empty partition key, no headers: none of them
	 * appears. */
	f.ev.subject = NULL;
	f.ev.partition_key = "";
	f.ev.headers_json = NULL;
	assert_int_equal(cloudevent_binary_headers(&f.ev, "cloudEvents_", &h,
						   reason, sizeof(reason)),
			 0);
	assert_headers(&h, want, sizeof(want) / sizeof(want[0]));
	ce_headers_release(&h);
	fixture_release(&f);
}

static void test_binary_kafka(void **state)
{
	struct fixture f;
	struct ce_headers h;
	char reason[256] = "";
	const struct kv want[] = {
	    {"ce_specversion", "1.0"},
	    {"ce_id", EV_ID},
	    {"ce_source", "urn:example:orders"},
	    {"ce_type", "com.example.order.created.v1"},
	    {"ce_subject", "order/42"},
	    {"ce_partitionkey", "order-42"},
	    {"traceparent", TRACEPARENT},
	    {"x-empty", ""},
	};

	(void)state;
	fixture_init(&f);
	f.ev.time = NULL;
	f.ev.headers_json =
	    "{\"traceparent\":\"" TRACEPARENT "\",\"x-empty\":\"\"}";
	assert_int_equal(
	    cloudevent_binary_headers(&f.ev, "ce_", &h, reason, sizeof(reason)),
	    0);
	assert_headers(&h, want, sizeof(want) / sizeof(want[0]));
	/* content-type is the transport's, never in the list */
	for (size_t i = 0; i < h.n; i++)
		assert_null(strstr(h.items[i].name, "content"));
	ce_headers_release(&h);
	fixture_release(&f);
}

static void test_headers_release_empty(void **state)
{
	struct ce_headers h = {0};

	(void)state;
	ce_headers_release(&h);
	ce_headers_release(&h);
	assert_int_equal(h.n, 0);
}

/* ---- structured mode ----------------------------------------------- */

static int b64_value(char c)
{
	static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqr"
				  "stuvwxyz0123456789+/";
	const char *p = c ? strchr(tbl, c) : NULL;

	return p ? (int)(p - tbl) : -1;
}

/* Decodes padded base64; returns a malloc'd buffer with *n bytes. */
static unsigned char *b64_decode(const char *s, size_t *n)
{
	size_t len = strlen(s), o = 0;
	unsigned char *out;

	assert_int_equal(len % 4, 0);
	out = malloc(len / 4 * 3 + 1);
	assert_non_null(out);
	for (size_t i = 0; i < len; i += 4) {
		int v[4];

		for (int k = 0; k < 4; k++) {
			v[k] = s[i + k] == '=' ? 0 : b64_value(s[i + k]);
			assert_true(v[k] >= 0);
		}
		out[o++] = (unsigned char)(v[0] << 2 | v[1] >> 4);
		if (s[i + 2] != '=')
			out[o++] =
			    (unsigned char)((v[1] & 15) << 4 | v[2] >> 2);
		if (s[i + 3] != '=')
			out[o++] = (unsigned char)((v[2] & 3) << 6 | v[3]);
	}
	*n = o;
	return out;
}

/* Encodes f's event, checks the framing, and returns the parsed envelope
 * (the text in *text when not NULL, else freed). */
static cJSON *encode(struct fixture *f, char **text)
{
	char reason[256] = "";
	size_t len = 0;
	char *out = cloudevent_structured(&f->ev, &len, reason, sizeof(reason));
	cJSON *doc;

	assert_non_null(out);
	assert_string_equal(reason, "");
	assert_int_equal(strlen(out), len);
	assert_int_equal(out[len], '\0');
	assert_null(strchr(out, '\n'));
	assert_null(strchr(out, '\r'));
	doc = cJSON_Parse(out);
	assert_non_null(doc);
	if (text)
		*text = out;
	else
		free(out);
	return doc;
}

static const char *member_string(const cJSON *doc, const char *name)
{
	const cJSON *m = cJSON_GetObjectItemCaseSensitive(doc, name);

	assert_non_null(m);
	assert_true(cJSON_IsString(m));
	return m->valuestring;
}

static void test_structured_attributes(void **state)
{
	static const char *const order[] = {
	    "specversion",
	    "id",
	    "source",
	    "type",
	    "time",
	    "subject",
	    "datacontenttype",
	    "partitionkey",
	    "traceparent",
	    "tracestate",
	    "data",
	};
	struct fixture f;
	const cJSON *m;
	cJSON *doc;
	size_t i = 0;

	(void)state;
	fixture_init(&f);
	f.ev.headers_json =
	    "{\"x-tenant\":\"acme\",\"traceparent\":\"" TRACEPARENT
	    "\",\"tracestate\":\"rojo=1\"}";
	doc = encode(&f, NULL);
	assert_string_equal(member_string(doc, "specversion"), "1.0");
	assert_string_equal(member_string(doc, "id"), EV_ID);
	assert_string_equal(member_string(doc, "source"), "urn:example:orders");
	assert_string_equal(member_string(doc, "type"),
			    "com.example.order.created.v1");
	assert_string_equal(member_string(doc, "time"), EV_TIME);
	assert_string_equal(member_string(doc, "subject"), "order/42");
	assert_string_equal(member_string(doc, "datacontenttype"),
			    "application/json");
	assert_string_equal(member_string(doc, "partitionkey"), "order-42");
	assert_string_equal(member_string(doc, "traceparent"), TRACEPARENT);
	assert_string_equal(member_string(doc, "tracestate"), "rojo=1");
	/* Members in the documented order and nothing else: transport
	 * headers such as x-tenant stay out of the envelope. */
	cJSON_ArrayForEach(m, doc)
	{
		assert_true(i < sizeof(order) / sizeof(order[0]));
		assert_string_equal(m->string, order[i]);
		i++;
	}
	assert_int_equal(i, sizeof(order) / sizeof(order[0]));
	m = cJSON_GetObjectItemCaseSensitive(doc, "data");
	assert_true(cJSON_IsObject(m));
	assert_int_equal(
	    cJSON_GetObjectItemCaseSensitive(m, "orderId")->valueint, 42);
	cJSON_Delete(doc);
	fixture_release(&f);
}

static void test_structured_optional_absent(void **state)
{
	struct fixture f;
	cJSON *doc;

	(void)state;
	fixture_init(&f);
	f.ev.subject = NULL;
	f.ev.partition_key = "";
	f.ev.time = NULL;
	f.ev.headers_json = NULL;
	doc = encode(&f, NULL);
	assert_null(cJSON_GetObjectItemCaseSensitive(doc, "subject"));
	assert_null(cJSON_GetObjectItemCaseSensitive(doc, "partitionkey"));
	assert_null(cJSON_GetObjectItemCaseSensitive(doc, "time"));
	assert_null(cJSON_GetObjectItemCaseSensitive(doc, "traceparent"));
	assert_null(cJSON_GetObjectItemCaseSensitive(doc, "tracestate"));
	assert_int_equal(cJSON_GetArraySize(doc), 6);
	cJSON_Delete(doc);
	fixture_release(&f);
}

static void test_structured_escapes_attributes(void **state)
{
	struct fixture f;
	cJSON *doc;

	(void)state;
	fixture_init(&f);
	f.ev.subject = "a \"quoted\" \\ back/slash \xc3\xbc";
	doc = encode(&f, NULL);
	assert_string_equal(member_string(doc, "subject"), f.ev.subject);
	cJSON_Delete(doc);
	fixture_release(&f);
}

/* Sets a JSON-typed payload, encodes it, and checks it was embedded as
 * the text `want` (verbatim, without blanks between tokens). Returns the
 * parsed envelope. */
static cJSON *embed(struct fixture *f, const char *payload, size_t n,
		    const char *want)
{
	char *text;
	char *expect;
	cJSON *doc;

	fixture_payload(f, payload, n);
	doc = encode(f, &text);
	assert_null(cJSON_GetObjectItemCaseSensitive(doc, "data_base64"));
	assert_non_null(cJSON_GetObjectItemCaseSensitive(doc, "data"));
	expect = malloc(strlen(want) + 16);
	assert_non_null(expect);
	strcpy(expect, ",\"data\":");
	strcat(expect, want);
	strcat(expect, "}");
	assert_true(strlen(text) > strlen(expect));
	assert_string_equal(text + strlen(text) - strlen(expect), expect);
	free(expect);
	free(text);
	return doc;
}

#define EMBED(f, lit, want) embed(f, lit, sizeof(lit) - 1, want)

static void test_structured_json_values(void **state)
{
	struct fixture f;
	const cJSON *d;
	cJSON *doc;

	(void)state;
	fixture_init(&f);

	doc = EMBED(&f, "{\"a\":[1,2,{\"b\":null}]}",
		    "{\"a\":[1,2,{\"b\":null}]}");
	d = cJSON_GetObjectItemCaseSensitive(doc, "data");
	assert_true(cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(d, "a")));
	cJSON_Delete(doc);

	/* A JSON string stays a JSON string, never wrapped again. */
	doc = EMBED(&f, "\"abc\"", "\"abc\"");
	d = cJSON_GetObjectItemCaseSensitive(doc, "data");
	assert_true(cJSON_IsString(d));
	assert_string_equal(d->valuestring, "abc");
	cJSON_Delete(doc);

	doc = EMBED(&f, "42", "42");
	d = cJSON_GetObjectItemCaseSensitive(doc, "data");
	assert_true(cJSON_IsNumber(d));
	assert_int_equal(d->valueint, 42);
	cJSON_Delete(doc);

	doc = EMBED(&f, "-0.5e+3", "-0.5e+3");
	assert_true(
	    cJSON_GetObjectItemCaseSensitive(doc, "data")->valuedouble ==
	    -500.0);
	cJSON_Delete(doc);

	doc = EMBED(&f, "true", "true");
	assert_true(
	    cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "data")));
	cJSON_Delete(doc);

	/* An explicit JSON null is data, not absent data. */
	doc = EMBED(&f, "null", "null");
	assert_true(
	    cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(doc, "data")));
	cJSON_Delete(doc);

	/* Numbers are kept verbatim: a double would round this one. */
	doc = EMBED(&f, "{\"n\":12345678901234567890}",
		    "{\"n\":12345678901234567890}");
	cJSON_Delete(doc);

	/* Strict number forms that look like the refused ones. */
	doc = EMBED(&f, "[0, 0.5, -0, -0.25, 1e05, 1E-007, 10, 100.001]",
		    "[0,0.5,-0,-0.25,1e05,1E-007,10,100.001]");
	cJSON_Delete(doc);

	fixture_release(&f);
}

static void test_structured_json_compacted(void **state)
{
	struct fixture f;
	const cJSON *d;
	cJSON *doc;

	(void)state;
	fixture_init(&f);
	/* Pretty-printed with blanks inside strings, an escaped quote and a
	 * string ending in an escaped backslash, which cJSON_Minify()
	 * mangles: the blanks inside strings must survive. */
	doc = EMBED(&f,
		    "{\n\t\"a\": \"x\\\\\",\r\n  \"b\" : \"hello "
		    "world\",\n  \"q\": \"say \\\"hi there\\\"\",\n"
		    "  \"u\": \"\xc3\xbc \\u00fc\",\n  \"e\": "
		    "\"\\/\\b\\f\\n\\r\\t\\u00E9\"\n}\n",
		    "{\"a\":\"x\\\\\",\"b\":\"hello world\",\"q\":\"say "
		    "\\\"hi there\\\"\",\"u\":\"\xc3\xbc "
		    "\\u00fc\",\"e\":\"\\/\\b\\f\\n\\r\\t\\u00E9\"}");
	d = cJSON_GetObjectItemCaseSensitive(doc, "data");
	assert_string_equal(
	    cJSON_GetObjectItemCaseSensitive(d, "a")->valuestring, "x\\");
	assert_string_equal(
	    cJSON_GetObjectItemCaseSensitive(d, "b")->valuestring,
	    "hello world");
	assert_string_equal(
	    cJSON_GetObjectItemCaseSensitive(d, "q")->valuestring,
	    "say \"hi there\"");
	assert_string_equal(
	    cJSON_GetObjectItemCaseSensitive(d, "u")->valuestring,
	    "\xc3\xbc \xc3\xbc");
	cJSON_Delete(doc);
	fixture_release(&f);
}

/* Encodes payload under f's content type and checks it went out as
 * data_base64 decoding back to the same bytes. */
static void expect_base64(struct fixture *f, const void *payload, size_t n)
{
	unsigned char *back;
	size_t backlen;
	cJSON *doc;

	fixture_payload(f, payload, n);
	doc = encode(f, NULL);
	assert_null(cJSON_GetObjectItemCaseSensitive(doc, "data"));
	back = b64_decode(member_string(doc, "data_base64"), &backlen);
	assert_int_equal(backlen, n);
	assert_memory_equal(back, payload, n);
	free(back);
	cJSON_Delete(doc);
}

#define EXPECT_B64(f, lit) expect_base64(f, lit, sizeof(lit) - 1)

static void test_structured_invalid_json_is_base64(void **state)
{
	struct fixture f;

	(void)state;
	fixture_init(&f);
	EXPECT_B64(&f, "{");
	EXPECT_B64(&f, "{\"a\":1,}");
	EXPECT_B64(&f, "[1,]");
	EXPECT_B64(&f, "{} x");
	EXPECT_B64(&f, "{}{}");
	EXPECT_B64(&f, "   ");
	EXPECT_B64(&f, "01");
	EXPECT_B64(&f, "[-01]");
	EXPECT_B64(&f, "[1.]");
	EXPECT_B64(&f, "[-.5]");
	EXPECT_B64(&f, "{'a':1}");
	EXPECT_B64(&f, "{\"a\":\"x\ny\"}");    /* raw newline in a string */
	EXPECT_B64(&f, "{\"a\":\"x\ty\"}");    /* raw tab in a string */
	EXPECT_B64(&f, "{\x01\"a\":1}");       /* cJSON skips it as blank */
	EXPECT_B64(&f, "{\"a\":\"\xff\"}");    /* invalid UTF-8 */
	EXPECT_B64(&f, "\xef\xbb\xbf{}");      /* byte-order mark */
	EXPECT_B64(&f, "{\"a\":\"\\x\"}");     /* bad escape */
	EXPECT_B64(&f, "{\"k\":\"\\uZZZZ\"}"); /* cJSON: \u0000 */
	EXPECT_B64(&f, "{\"k\":\"\\u12\"}");   /* cut short */
	EXPECT_B64(&f, "[\"\\u00e\"]");
	EXPECT_B64(&f, "{\"a\":\"\\a\"}");     /* no such escape */
	EXPECT_B64(&f, "{\"a\":\"\\ud800\"}"); /* lone surrogate */
	EXPECT_B64(&f, "{\"a\":\"\0\"}");      /* NUL byte */
	EXPECT_B64(&f, "\"unterminated");
	EXPECT_B64(&f, "nul");
	fixture_release(&f);
}

/* Memory running out inside cJSON at each of its allocations in turn
 * (encode_test.h) is never taken for the row's fault: the row is
 * refused as "out of memory" (the caller retries it) or encoded right.
 * cJSON returns NULL for both; an earlier version failed the row for
 * good as "headers are not valid json", or sent a JSON payload as
 * data_base64. */
static void test_out_of_memory_is_not_the_rows(void **state)
{
	static const char payload[] = "{\"orderId\":42,\"lines\":[1,2]}";
	struct fixture f;
	char reason[256];
	int refused = 0;

	(void)state;
	fixture_init(&f);
	f.ev.headers_json =
	    "{\"x-tenant\":\"t1\",\"traceparent\":\"" TRACEPARENT "\"}";
	fixture_payload(&f, payload, strlen(payload));
	for (int after = 0; after < 64; after++) {
		struct ce_headers h = {0};
		size_t len = 0;

		encode_test_json_fail(after, 1000);
		int valid = cloudevent_validate(&f.ev, reason, sizeof(reason));
		encode_test_json_fail(0, 0);
		if (valid != 0) {
			assert_string_equal(reason, CLOUDEVENT_NO_MEMORY);
			refused++;
		}
		encode_test_json_fail(after, 1000);
		int binary = cloudevent_binary_headers(&f.ev, "ce-", &h, reason,
						       sizeof(reason));
		encode_test_json_fail(0, 0);
		if (binary != 0)
			assert_string_equal(reason, CLOUDEVENT_NO_MEMORY);
		ce_headers_release(&h);
		encode_test_json_fail(after, 1000);
		char *line =
		    cloudevent_structured(&f.ev, &len, reason, sizeof(reason));
		encode_test_json_fail(0, 0);
		if (!line) {
			assert_string_equal(reason, CLOUDEVENT_NO_MEMORY);
			refused++;
			continue;
		}
		assert_non_null(strstr(line, ",\"data\":{\"orderId\":42"));
		assert_null(strstr(line, "data_base64"));
		free(line);
	}
	/* Memory did run out: at the headers' parse and at the payload's. */
	assert_true(refused >= 3);
	fixture_release(&f);
}

static void test_structured_binary_roundtrip(void **state)
{
	unsigned char bytes[256];
	struct fixture f;

	(void)state;
	for (size_t i = 0; i < sizeof(bytes); i++)
		bytes[i] = (unsigned char)i;
	fixture_init(&f);
	f.ev.content_type = "application/octet-stream";
	for (size_t n = 0; n <= sizeof(bytes); n += 37)
		expect_base64(&f, bytes, n);
	expect_base64(&f, bytes, sizeof(bytes));
	/* Valid JSON under a non-JSON type is still bytes. */
	f.ev.content_type = "text/plain";
	EXPECT_B64(&f, "{\"a\":1}");
	fixture_release(&f);
}

static void test_structured_base64_vectors(void **state)
{
	/* RFC 4648, section 10 */
	static const struct {
		const char *in, *out;
	} vec[] = {
	    {"", ""},
	    {"f", "Zg=="},
	    {"fo", "Zm8="},
	    {"foo", "Zm9v"},
	    {"foob", "Zm9vYg=="},
	    {"fooba", "Zm9vYmE="},
	    {"foobar", "Zm9vYmFy"},
	};
	struct fixture f;

	(void)state;
	fixture_init(&f);
	f.ev.content_type = "application/octet-stream";
	for (size_t i = 0; i < sizeof(vec) / sizeof(vec[0]); i++) {
		cJSON *doc;

		fixture_payload(&f, vec[i].in, strlen(vec[i].in));
		doc = encode(&f, NULL);
		assert_string_equal(member_string(doc, "data_base64"),
				    vec[i].out);
		cJSON_Delete(doc);
	}
	fixture_release(&f);
}

static void test_structured_empty_payload(void **state)
{
	struct fixture f;
	cJSON *doc;

	(void)state;
	fixture_init(&f);
	fixture_payload(&f, "", 0);
	doc = encode(&f, NULL);
	assert_null(cJSON_GetObjectItemCaseSensitive(doc, "data"));
	assert_string_equal(member_string(doc, "data_base64"), "");
	assert_string_equal(member_string(doc, "datacontenttype"),
			    "application/json");
	cJSON_Delete(doc);
	fixture_release(&f);
}

static void test_structured_content_type_params(void **state)
{
	struct fixture f;
	cJSON *doc;

	(void)state;
	fixture_init(&f);
	f.ev.content_type = "Application/JSON; charset=utf-8";
	doc = EMBED(&f, "{\"k\":\"v\"}", "{\"k\":\"v\"}");
	assert_string_equal(member_string(doc, "datacontenttype"),
			    "Application/JSON; charset=utf-8");
	cJSON_Delete(doc);

	f.ev.content_type = "application/vnd.example.order+json;v=2";
	doc = EMBED(&f, "[1]", "[1]");
	cJSON_Delete(doc);

	/* No content type: the attribute is left out and the bytes go as
	 * base64 rather than being assumed JSON. */
	f.ev.content_type = "";
	EXPECT_B64(&f, "{\"k\":\"v\"}");
	doc = encode(&f, NULL);
	assert_null(cJSON_GetObjectItemCaseSensitive(doc, "datacontenttype"));
	cJSON_Delete(doc);
	fixture_release(&f);
}

static void test_structured_large_payload(void **state)
{
	size_t n = 200000;
	char *big = malloc(n);
	struct fixture f;
	cJSON *doc;
	int items = 1;

	(void)state;
	assert_non_null(big);
	memset(big, ' ', n);
	big[0] = '[';
	for (size_t i = 1; i + 2 < n - 3; i += 10, items++)
		memcpy(big + i, "1,", 2);
	memcpy(big + n - 3, "2]\n", 3);
	fixture_init(&f);
	fixture_payload(&f, big, n);
	doc = encode(&f, NULL);
	assert_int_equal(
	    cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "data")),
	    items);
	cJSON_Delete(doc);
	f.ev.content_type = "application/octet-stream";
	expect_base64(&f, big, n);
	free(big);
	fixture_release(&f);
}

static void test_is_json_type(void **state)
{
	static const struct {
		const char *ct;
		bool json;
	} cases[] = {
	    {"application/json", true},
	    {"APPLICATION/JSON", true},
	    {"text/json", true},
	    {"application/json; charset=utf-8", true},
	    {"  application/json  ;charset=utf-8", true},
	    {"application/cloudevents+json", true},
	    {"application/vnd.api+JSON", true},
	    {"application/ld+json; profile=x", true},
	    {"application/jsonx", false},
	    {"application/json-seq", false},
	    {"application/x-json-stream", false},
	    {"text/plain", false},
	    {"application/octet-stream", false},
	    {"json", false},
	    {"+json", false},
	    {"/json", false},
	    {"application/+json", false},
	    {"application/xml; x=+json", false},
	    {"", false},
	    {NULL, false},
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		print_message("%s\n", cases[i].ct ? cases[i].ct : "(null)");
		assert_int_equal(cloudevent_is_json_type(cases[i].ct),
				 cases[i].json);
	}
}

static void test_structured_content_type(void **state)
{
	(void)state;
	assert_string_equal(cloudevent_structured_content_type(),
			    "application/cloudevents+json; charset=UTF-8");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_validate_table),
	    cmocka_unit_test(test_validate_null_reason),
	    cmocka_unit_test(test_row_bytes),
	    cmocka_unit_test(test_binary_amqp_ce_dash),
	    cmocka_unit_test(test_binary_amqp_cloudevents_prefix),
	    cmocka_unit_test(test_binary_kafka),
	    cmocka_unit_test(test_headers_release_empty),
	    cmocka_unit_test(test_structured_attributes),
	    cmocka_unit_test(test_structured_optional_absent),
	    cmocka_unit_test(test_structured_escapes_attributes),
	    cmocka_unit_test(test_structured_json_values),
	    cmocka_unit_test(test_structured_json_compacted),
	    cmocka_unit_test(test_structured_invalid_json_is_base64),
	    cmocka_unit_test(test_out_of_memory_is_not_the_rows),
	    cmocka_unit_test(test_structured_binary_roundtrip),
	    cmocka_unit_test(test_structured_base64_vectors),
	    cmocka_unit_test(test_structured_empty_payload),
	    cmocka_unit_test(test_structured_content_type_params),
	    cmocka_unit_test(test_structured_large_payload),
	    cmocka_unit_test(test_is_json_type),
	    cmocka_unit_test(test_structured_content_type),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
