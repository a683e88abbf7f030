/* SPDX-License-Identifier: MIT */
/* CloudEvents 1.0 encoding of outbox rows: validation, binary-mode headers,
 * structured-mode JSON envelope. */
#include "encode.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#define SPECVERSION "1.0"
#define OOM_REASON CLOUDEVENT_NO_MEMORY
/* Bytes of a header name quoted in a reason: keeps every reason well
 * inside pub_result.reason (256). */
#define REASON_NAME_MAX 64

static void set_reason(char *reason, size_t reasonlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_reason(char *reason, size_t reasonlen, const char *fmt, ...)
{
	va_list ap;

	if (!reason || reasonlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(reason, reasonlen, fmt, ap);
	va_end(ap);
}

static unsigned char ascii_lower(unsigned char c)
{
	return c >= 'A' && c <= 'Z' ? (unsigned char)(c - 'A' + 'a') : c;
}

/* ASCII-only on purpose: strcasecmp() follows the locale. */
static bool prefix_ci(const char *s, const char *prefix)
{
	for (; *prefix; s++, prefix++)
		if (ascii_lower((unsigned char)*s) !=
		    ascii_lower((unsigned char)*prefix))
			return false;
	return true;
}

static bool equal_ci_n(const char *s, size_t n, const char *lit)
{
	if (strlen(lit) != n)
		return false;
	for (size_t i = 0; i < n; i++)
		if (ascii_lower((unsigned char)s[i]) !=
		    ascii_lower((unsigned char)lit[i]))
			return false;
	return true;
}

static bool is_control(uint32_t cp)
{
	return cp <= 0x1F || (cp >= 0x7F && cp <= 0x9F);
}

static bool is_noncharacter(uint32_t cp)
{
	return (cp >= 0xFDD0 && cp <= 0xFDEF) || (cp & 0xFFFE) == 0xFFFE;
}

/*
 * What keeps s from being a CloudEvents String (the type system excludes
 * control characters and noncharacters), or NULL when it is one. With
 * strict false only UTF-8 validity is checked.
 */
static const char *string_problem(const char *s, bool strict)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t len;

	/* Attribute values are printable ASCII nearly always, and that
	 * passes either check without decoding: this runs for every
	 * attribute of every event. */
	while (*p >= 0x20 && *p < 0x7f)
		p++;
	if (*p == '\0')
		return NULL;
	len = strlen((const char *)p);
	while (len > 0) {
		uint32_t cp;
		size_t k = utf8_decode(p, len, &cp);

		if (k == 0)
			return "is not valid utf-8";
		if (strict && is_control(cp))
			return "contains a control character";
		if (strict && is_noncharacter(cp))
			return "contains a unicode noncharacter";
		p += k;
		len -= k;
	}
	return NULL;
}

void cloudevent_quote(char *dst, size_t dstlen, const char *s, size_t len,
		      size_t max)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t o = 0;

	if (max + 4 > dstlen)
		max = dstlen - 4;
	while (len > 0) {
		uint32_t cp = 0;
		size_t k = utf8_decode(p, len, &cp);
		bool bad = k == 0 || is_control(cp) || cp == '"' || cp == '\\';
		size_t need = bad ? 1 : k;

		if (o + need > max) {
			memcpy(dst + o, "...", 3);
			o += 3;
			break;
		}
		if (bad)
			dst[o] = '?';
		else
			memcpy(dst + o, p, k);
		o += need;
		p += k ? k : 1;
		len -= k ? k : 1;
	}
	dst[o] = '\0';
}

static bool header_collides(const char *name)
{
	return prefix_ci(name, "ce_") || prefix_ci(name, "ce-") ||
	       prefix_ci(name, "cloudevents") ||
	       equal_ci_n(name, strlen(name), "content-type");
}

static bool is_set(const char *s)
{
	return s && *s;
}

/* True when s holds a C0 control character or DEL. */
static bool has_ascii_control(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			return true;
	return false;
}

/*
 * source as a URI-reference, and the destination columns without control
 * characters: migration 004's CHECKs refuse those, but a table made by
 * hand may lack them (§10), and an exchange reaches log lines (a pause)
 * as well as broker frames.
 */
static int destination_check(const struct outbox_event *ev, char *reason,
			     size_t reasonlen)
{
	char why[96];

	if (cloudevent_uri_reference_problem(ev->source, why, sizeof(why))) {
		set_reason(reason, reasonlen,
			   "source is not a URI-reference (RFC 3986): %s", why);
		return -1;
	}
	if (ev->exchange && has_ascii_control(ev->exchange)) {
		set_reason(reason, reasonlen,
			   "exchange contains a control character");
		return -1;
	}
	if (ev->routing_key && has_ascii_control(ev->routing_key)) {
		set_reason(reason, reasonlen,
			   "routing_key contains a control character");
		return -1;
	}
	return 0;
}

/* Checks the row's own attributes (everything but the headers). */
static int attributes_check(const struct outbox_event *ev, char *reason,
			    size_t reasonlen)
{
	const struct {
		const char *name;
		const char *value;
	} strings[] = {
	    {"id", ev->id},
	    {"type", ev->type},
	    {"source", ev->source},
	    {"subject", ev->subject},
	    {"partition_key", ev->partition_key},
	    {"content_type", ev->content_type},
	    {"time", ev->time},
	};

	/* The required three: reported by name before anything else so the
	 * reason points at the column to fix. */
	for (size_t i = 0; i < 3; i++) {
		if (!is_set(strings[i].value)) {
			set_reason(reason, reasonlen, "empty %s",
				   strings[i].name);
			return -1;
		}
	}
	for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
		const char *problem;

		if (!strings[i].value)
			continue;
		problem = string_problem(strings[i].value, true);
		if (problem) {
			set_reason(reason, reasonlen, "%s %s", strings[i].name,
				   problem);
			return -1;
		}
	}
	const char *problem =
	    is_set(ev->content_type)
		? cloudevent_media_type_problem(ev->content_type)
		: NULL;
	if (problem) {
		set_reason(reason, reasonlen, "content_type %s", problem);
		return -1;
	}
	return destination_check(ev, reason, reasonlen);
}

static bool is_trace_header(const char *name)
{
	return strcmp(name, "traceparent") == 0 ||
	       strcmp(name, "tracestate") == 0;
}

/* Checks one header but for its name's uniqueness (headers_unique()). */
static int header_check(const cJSON *h, char *reason, size_t reasonlen)
{
	char quoted[REASON_NAME_MAX + 4];
	const char *name = h->string;
	const char *problem;

	if (!name || !*name) {
		set_reason(reason, reasonlen, "empty header name");
		return -1;
	}
	cloudevent_quote(quoted, sizeof(quoted), name, strlen(name),
			 REASON_NAME_MAX);
	problem = string_problem(name, true);
	if (problem) {
		set_reason(reason, reasonlen, "header name \"%s\" %s", quoted,
			   problem);
		return -1;
	}
	if (header_collides(name)) {
		set_reason(reason, reasonlen,
			   equal_ci_n(name, strlen(name), "content-type")
			       ? "header \"%s\" collides with the "
				 "content type the relay writes"
			       : "header \"%s\" collides with a "
				 "CloudEvents attribute",
			   quoted);
		return -1;
	}
	if (!cJSON_IsString(h) || !h->valuestring) {
		set_reason(reason, reasonlen, "header \"%s\" is not a string",
			   quoted);
		return -1;
	}
	problem = string_problem(h->valuestring, is_trace_header(name));
	if (problem) {
		set_reason(reason, reasonlen, "header \"%s\" value %s", quoted,
			   problem);
		return -1;
	}
	return 0;
}

static int name_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/*
 * jsonb cannot hold duplicate keys, but JSON text can, and a transport
 * header table must not. Sorted, not compared pairwise: a row of a million
 * headers took each check minutes that way, its lease running out. 0, or
 * -1 with reason set (OOM_REASON when memory ran out).
 */
static int headers_unique(const cJSON *obj, char *reason, size_t reasonlen)
{
	size_t n = 0, k = 0;
	const cJSON *h;
	int rc = 0;

	cJSON_ArrayForEach(h, obj) n++;
	if (n < 2)
		return 0;
	const char **names = malloc(n * sizeof(*names));
	if (!names) {
		set_reason(reason, reasonlen, "%s", OOM_REASON);
		return -1;
	}
	cJSON_ArrayForEach(h, obj) names[k++] = h->string;
	qsort(names, n, sizeof(*names), name_cmp);
	for (k = 1; k < n && rc == 0; k++) {
		if (strcmp(names[k - 1], names[k]) == 0) {
			char quoted[REASON_NAME_MAX + 4];
			cloudevent_quote(quoted, sizeof(quoted), names[k],
					 strlen(names[k]), REASON_NAME_MAX);
			set_reason(reason, reasonlen, "duplicate header \"%s\"",
				   quoted);
			rc = -1;
		}
	}
	free(names);
	return rc;
}

/*
 * Parses and checks ev->headers_json into *out (the caller deletes it;
 * NULL when the row has no headers: the column NULL or the empty object,
 * its default, which needs no parsing). 0, or -1 with reason set: the
 * row's fault, or OOM_REASON when memory ran out inside cJSON.
 */
static int headers_parse(const struct outbox_event *ev, cJSON **out,
			 char *reason, size_t reasonlen)
{
	cJSON *obj;
	const cJSON *h;

	*out = NULL;
	if (!ev->headers_json || strcmp(ev->headers_json, "{}") == 0)
		return 0;
	const char *escape = encode_json_u_escape_problem(ev->headers_json);
	if (escape) {
		set_reason(reason, reasonlen, "%s", escape);
		return -1;
	}
	encode_json_memory_watch();
	obj = cJSON_ParseWithOpts(ev->headers_json, NULL, 1);
	if (!obj) {
		set_reason(reason, reasonlen, "%s",
			   encode_json_memory_ran_out()
			       ? OOM_REASON
			       : "headers are not valid json");
		return -1;
	}
	if (!cJSON_IsObject(obj)) {
		set_reason(reason, reasonlen, "headers are not a json object");
		goto fail;
	}
	cJSON_ArrayForEach(h, obj)
	{
		if (header_check(h, reason, reasonlen) != 0)
			goto fail;
	}
	if (headers_unique(obj, reason, reasonlen) != 0)
		goto fail;
	*out = obj;
	return 0;
fail:
	cJSON_Delete(obj);
	return -1;
}

static size_t text_bytes(const char *s)
{
	return s ? strlen(s) : 0;
}

size_t cloudevent_row_bytes(const struct outbox_event *ev)
{
	return ev->payload_len + text_bytes(ev->headers_json) +
	       text_bytes(ev->type) + text_bytes(ev->source) +
	       text_bytes(ev->subject) + text_bytes(ev->content_type) +
	       text_bytes(ev->partition_key);
}

int cloudevent_validate(const struct outbox_event *ev, char *reason,
			size_t reasonlen)
{
	cJSON *headers;

	if (attributes_check(ev, reason, reasonlen) != 0 ||
	    headers_parse(ev, &headers, reason, reasonlen) != 0)
		return -1;
	cJSON_Delete(headers);
	return 0;
}

/* The header table is one allocation: the items, then every name and
 * value after them (see struct ce_header). */
struct header_arena {
	struct ce_headers *h;
	char *next; /* where the next string goes */
};

/* Bytes prefix+name = value takes in the arena. */
static size_t header_size(const char *prefix, const char *name,
			  const char *value)
{
	return strlen(prefix) + strlen(name) + 1 + strlen(value) + 1;
}

/* Appends prefix+name = value; the arena was sized by header_size(). */
static void headers_push(struct header_arena *a, const char *prefix,
			 const char *name, const char *value)
{
	size_t pl = strlen(prefix), nl = strlen(name), vl = strlen(value);
	struct ce_header *item = &a->h->items[a->h->n++];

	item->name = a->next;
	memcpy(a->next, prefix, pl);
	memcpy(a->next + pl, name, nl + 1);
	item->value = a->next + pl + nl + 1;
	memcpy(item->value, value, vl + 1);
	a->next = item->value + vl + 1;
}

int cloudevent_binary_headers(const struct outbox_event *ev, const char *prefix,
			      struct ce_headers *out, char *reason,
			      size_t reasonlen)
{
	struct ce_headers h = {0};
	struct header_arena arena;
	struct {
		const char *name;
		const char *value;
	} attrs[7];
	cJSON *headers = NULL;
	const cJSON *it;
	size_t n_attrs = 0, count, bytes;
	int ret = -1;

	*out = (struct ce_headers){0};
	if (attributes_check(ev, reason, reasonlen) != 0)
		goto out;
	if (headers_parse(ev, &headers, reason, reasonlen) != 0)
		goto out;

	attrs[n_attrs].name = "specversion";
	attrs[n_attrs++].value = SPECVERSION;
	attrs[n_attrs].name = "id";
	attrs[n_attrs++].value = ev->id;
	attrs[n_attrs].name = "source";
	attrs[n_attrs++].value = ev->source;
	attrs[n_attrs].name = "type";
	attrs[n_attrs++].value = ev->type;
	if (is_set(ev->time)) {
		attrs[n_attrs].name = "time";
		attrs[n_attrs++].value = ev->time;
	}
	if (is_set(ev->subject)) {
		attrs[n_attrs].name = "subject";
		attrs[n_attrs++].value = ev->subject;
	}
	if (is_set(ev->partition_key)) {
		attrs[n_attrs].name = "partitionkey";
		attrs[n_attrs++].value = ev->partition_key;
	}
	count = n_attrs + (size_t)cJSON_GetArraySize(headers);
	bytes = count * sizeof(*h.items);
	for (size_t i = 0; i < n_attrs; i++)
		bytes += header_size(prefix, attrs[i].name, attrs[i].value);
	cJSON_ArrayForEach(it, headers)
	{
		bytes += header_size("", it->string, it->valuestring);
	}
	h.items = malloc(bytes);
	if (!h.items) {
		set_reason(reason, reasonlen, OOM_REASON);
		goto out;
	}
	arena =
	    (struct header_arena){.h = &h, .next = (char *)(h.items + count)};
	for (size_t i = 0; i < n_attrs; i++)
		headers_push(&arena, prefix, attrs[i].name, attrs[i].value);
	cJSON_ArrayForEach(it, headers)
	{
		headers_push(&arena, "", it->string, it->valuestring);
	}
	*out = h;
	h = (struct ce_headers){0};
	ret = 0;
out:
	ce_headers_release(&h);
	cJSON_Delete(headers);
	return ret;
}

void ce_headers_release(struct ce_headers *h)
{
	free(h->items);
	*h = (struct ce_headers){0};
}

const char *cloudevent_structured_content_type(void)
{
	return "application/cloudevents+json; charset=UTF-8";
}

static bool is_blank(char c)
{
	return c == ' ' || c == '\t';
}

bool cloudevent_is_json_type(const char *content_type)
{
	const char *s = content_type, *end, *slash, *sub;
	size_t sublen;

	if (!s)
		return false;
	while (is_blank(*s))
		s++;
	end = strchr(s, ';');
	if (!end)
		end = s + strlen(s);
	while (end > s && is_blank(end[-1]))
		end--;
	slash = memchr(s, '/', (size_t)(end - s));
	if (!slash || slash == s)
		return false;
	if (equal_ci_n(s, (size_t)(end - s), "application/json") ||
	    equal_ci_n(s, (size_t)(end - s), "text/json"))
		return true;
	sub = slash + 1;
	sublen = (size_t)(end - sub);
	return sublen > 5 && equal_ci_n(end - 5, 5, "+json");
}

static size_t base64_encode(const unsigned char *src, size_t n, char *dst)
{
	static const char tbl[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t i = 0, o = 0;

	for (; n - i >= 3; i += 3) {
		uint32_t v = (uint32_t)src[i] << 16 |
			     (uint32_t)src[i + 1] << 8 | src[i + 2];

		dst[o++] = tbl[v >> 18 & 63];
		dst[o++] = tbl[v >> 12 & 63];
		dst[o++] = tbl[v >> 6 & 63];
		dst[o++] = tbl[v & 63];
	}
	if (i < n) {
		uint32_t v = (uint32_t)src[i] << 16;

		if (n - i == 2)
			v |= (uint32_t)src[i + 1] << 8;
		dst[o++] = tbl[v >> 18 & 63];
		dst[o++] = tbl[v >> 12 & 63];
		dst[o++] = n - i == 2 ? tbl[v >> 6 & 63] : '=';
		dst[o++] = '=';
	}
	return o;
}

/* Adds name = value to env when value is non-empty; false on OOM. */
static bool add_optional(cJSON *env, const char *name, const char *value)
{
	return !is_set(value) || cJSON_AddStringToObject(env, name, value);
}

/* The envelope without its data member, as a cJSON object. */
static cJSON *envelope_attributes(const struct outbox_event *ev,
				  const cJSON *headers)
{
	cJSON *env = cJSON_CreateObject();
	const char *tp = cJSON_GetStringValue(
	    cJSON_GetObjectItemCaseSensitive(headers, "traceparent"));
	const char *ts = cJSON_GetStringValue(
	    cJSON_GetObjectItemCaseSensitive(headers, "tracestate"));

	if (!env)
		return NULL;
	if (!cJSON_AddStringToObject(env, "specversion", SPECVERSION) ||
	    !cJSON_AddStringToObject(env, "id", ev->id) ||
	    !cJSON_AddStringToObject(env, "source", ev->source) ||
	    !cJSON_AddStringToObject(env, "type", ev->type) ||
	    !add_optional(env, "time", ev->time) ||
	    !add_optional(env, "subject", ev->subject) ||
	    !add_optional(env, "datacontenttype", ev->content_type) ||
	    !add_optional(env, "partitionkey", ev->partition_key) ||
	    !add_optional(env, "traceparent", tp) ||
	    !add_optional(env, "tracestate", ts)) {
		cJSON_Delete(env);
		return NULL;
	}
	return env;
}

char *cloudevent_structured(const struct outbox_event *ev, size_t *len,
			    char *reason, size_t reasonlen)
{
	static const char data_json[] = ",\"data\":";
	static const char data_b64[] = ",\"data_base64\":\"";
	const unsigned char *payload = ev->payload;
	size_t n = ev->payload_len;
	cJSON *headers = NULL, *env = NULL;
	char *head = NULL, *buf = NULL, *ret = NULL;
	size_t headlen, b64len, cap, pos;

	*len = 0;
	if (attributes_check(ev, reason, reasonlen) != 0)
		goto out;
	if (headers_parse(ev, &headers, reason, reasonlen) != 0)
		goto out;
	env = envelope_attributes(ev, headers);
	if (!env)
		goto oom;
	head = cJSON_PrintUnformatted(env);
	if (!head)
		goto oom;
	/* The data member is spliced in after cJSON printed the attributes:
	 * the payload is kept verbatim (cJSON would turn large integers
	 * into doubles) and is copied only once. */
	headlen = strlen(head);
	if (headlen < 2 || head[headlen - 1] != '}')
		goto oom;
	if (n > (SIZE_MAX - headlen - sizeof(data_b64) - 8) / 4 * 3)
		goto oom;
	b64len = (n + 2) / 3 * 4;
	/* Room for either form: compact JSON is never longer than n, and
	 * n <= b64len for any n > 0. */
	cap = headlen + sizeof(data_b64) + b64len + 2;
	buf = malloc(cap);
	if (!buf)
		goto oom;
	pos = headlen - 1; /* drops the closing brace */
	memcpy(buf, head, pos);

	if (n > 0 && cloudevent_is_json_type(ev->content_type)) {
		size_t at = pos + sizeof(data_json) - 1;
		size_t m = encode_json_compact(payload, n, buf + at);

		int parses =
		    m != SIZE_MAX ? encode_json_value_parses(payload, n) : 0;
		if (parses < 0)
			goto oom;
		if (parses) {
			memcpy(buf + pos, data_json, sizeof(data_json) - 1);
			pos = at + m;
			goto close;
		}
	}
	memcpy(buf + pos, data_b64, sizeof(data_b64) - 1);
	pos += sizeof(data_b64) - 1;
	pos += base64_encode(payload, n, buf + pos);
	buf[pos++] = '"';
close:
	buf[pos++] = '}';
	buf[pos] = '\0';
	*len = pos;
	ret = buf;
	buf = NULL;
	goto out;
oom:
	set_reason(reason, reasonlen, OOM_REASON);
out:
	free(buf);
	cJSON_free(head);
	cJSON_Delete(env);
	cJSON_Delete(headers);
	return ret;
}
