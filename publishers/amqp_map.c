/* SPDX-License-Identifier: MIT */
/* The AMQP 0-9-1 form of an outbox event and the reading of RabbitMQ's
 * channel-error texts; no I/O (see amqp_map.h). */
#include "amqp_map.h"

#include "encode/encode.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An AMQP short string (names, most properties) holds at most this. */
#define SHORTSTR_MAX 255
/* Bytes of a name quoted in a reason: keeps reasons inside 256. */
#define QUOTE_MAX 64

static void set_reason(char *reason, size_t reasonlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_reason(char *reason, size_t reasonlen, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!reason || reasonlen == 0)
		return;
	va_start(ap, fmt);
	n = vsnprintf(reason, reasonlen, fmt, ap);
	va_end(ap);
	if (n >= 0 && (size_t)n >= reasonlen)
		rmq_map_utf8_cut(reason);
}

void rmq_map_utf8_cut(char *s)
{
	size_t len = strlen(s), i = len;
	unsigned char lead;
	size_t need;

	while (i > 0 && ((unsigned char)s[i - 1] & 0xC0) == 0x80)
		i--;
	if (i == 0)
		return;
	lead = (unsigned char)s[i - 1];
	if (lead < 0xC0)
		return; /* ASCII: nothing was split */
	need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : 2;
	if (i - 1 + need > len)
		s[i - 1] = '\0';
}

static amqp_bytes_t bytes_of(const char *s)
{
	return amqp_cstring_bytes(s ? s : "");
}

/* Refuses a name that does not fit an AMQP short string. */
static int check_shortstr(const char *what, const char *s, char *reason,
			  size_t reasonlen)
{
	size_t len = strlen(s);
	char quoted[QUOTE_MAX + 4];

	if (len <= SHORTSTR_MAX)
		return 0;
	cloudevent_quote(quoted, sizeof(quoted), s, len, 32);
	set_reason(reason, reasonlen,
		   "%s '%s' is %zu bytes, over the 255 of an AMQP short "
		   "string",
		   what, quoted, len);
	return -1;
}

/* RabbitMQ reads headers CC and BCC (those names exactly) as extra routing
 * keys and closes the channel on one that is not an array, which a row's
 * header (a string) never is: the broker's reason names no message, so
 * every row of the batch was in doubt and retried, this one for ever. */
static int check_routing_header(const char *name, char *reason,
				size_t reasonlen)
{
	if (strcmp(name, "CC") != 0 && strcmp(name, "BCC") != 0)
		return 0;
	set_reason(reason, reasonlen,
		   "header %s: RabbitMQ reads CC and BCC as extra routing "
		   "keys (an array) and refuses a string there; give the "
		   "header another name",
		   name);
	return -1;
}

/* True for names cloudevent_binary_headers() put under the prefix (the
 * row's own headers cannot start with it: validation refuses them). */
static bool has_prefix(const char *name, const char *prefix)
{
	return strncmp(name, prefix, strlen(prefix)) == 0;
}

/* The header table: the ce headers (binary mode) and the row's own. */
static int msg_headers(struct rmq_msg *m, bool structured, const char *prefix)
{
	size_t n = 0;

	if (m->ce.n > 0) {
		m->entries = calloc(m->ce.n, sizeof(*m->entries));
		if (!m->entries)
			return -1;
	}
	for (size_t i = 0; i < m->ce.n; i++) {
		const struct ce_header *h = &m->ce.items[i];

		/* Structured mode carries the attributes in the body; only
		 * the row's transport headers go in the table. */
		if (structured && has_prefix(h->name, prefix))
			continue;
		m->entries[n].key = amqp_cstring_bytes(h->name);
		m->entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
		m->entries[n].value.value.bytes = amqp_cstring_bytes(h->value);
		n++;
	}
	if (n > 0) {
		m->props._flags |= AMQP_BASIC_HEADERS_FLAG;
		m->props.headers.num_entries = (int)n;
		m->props.headers.entries = m->entries;
	}
	return 0;
}

/* Body and content type: the envelope, or the payload as it is. */
static int msg_body(struct rmq_msg *m, const struct outbox_event *ev,
		    bool structured, char *reason, size_t reasonlen)
{
	amqp_basic_properties_t *p = &m->props;

	if (structured) {
		size_t len = 0;

		m->structured =
		    cloudevent_structured(ev, &len, reason, reasonlen);
		if (!m->structured)
			return -1;
		m->body.bytes = m->structured;
		m->body.len = len;
		p->_flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
		p->content_type =
		    amqp_cstring_bytes(cloudevent_structured_content_type());
		return 0;
	}
	m->body.bytes = (void *)ev->payload;
	m->body.len = ev->payload_len;
	if (ev->content_type && *ev->content_type) {
		if (check_shortstr("content type", ev->content_type, reason,
				   reasonlen))
			return -1;
		p->_flags |= AMQP_BASIC_CONTENT_TYPE_FLAG;
		p->content_type = amqp_cstring_bytes(ev->content_type);
	}
	return 0;
}

/* The properties every message carries, whatever the mode. */
static void msg_fixed_props(amqp_basic_properties_t *p,
			    const struct outbox_event *ev)
{
	p->_flags |= AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_TIMESTAMP_FLAG |
		     AMQP_BASIC_APP_ID_FLAG;
	p->delivery_mode = 2;
	p->timestamp =
	    ev->created_at_us > 0 ? (uint64_t)(ev->created_at_us / 1000000) : 0;
	p->app_id = amqp_cstring_bytes(RMQ_MAP_APP_ID);
	if (strlen(ev->id) <= SHORTSTR_MAX) {
		p->_flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
		p->message_id = amqp_cstring_bytes(ev->id);
	}
	if (strlen(ev->type) <= SHORTSTR_MAX) {
		p->_flags |= AMQP_BASIC_TYPE_FLAG;
		p->type = amqp_cstring_bytes(ev->type);
	}
}

int rmq_msg_build(const struct config *cfg, const struct outbox_event *ev,
		  struct rmq_msg *m, char *reason, size_t reasonlen)
{
	const struct rmq_settings *as = rmq_settings_of(cfg);
	const char *prefix = as->header_prefix ? as->header_prefix : "ce-";
	bool structured = cfg->ce_mode == CE_MODE_STRUCTURED;
	const char *exchange =
	    ev->exchange ? ev->exchange : (as->exchange ? as->exchange : "");
	const char *routing_key = ev->routing_key ? ev->routing_key : "";

	*m = (struct rmq_msg){0};
	if (check_shortstr("exchange", exchange, reason, reasonlen) ||
	    check_shortstr("routing key", routing_key, reason, reasonlen))
		goto fail;
	if (cloudevent_binary_headers(ev, prefix, &m->ce, reason, reasonlen))
		goto fail;
	for (size_t i = 0; i < m->ce.n; i++)
		if (check_shortstr("header name", m->ce.items[i].name, reason,
				   reasonlen) ||
		    check_routing_header(m->ce.items[i].name, reason,
					 reasonlen))
			goto fail;
	if (msg_headers(m, structured, prefix) != 0) {
		set_reason(reason, reasonlen, "out of memory");
		goto fail;
	}
	if (msg_body(m, ev, structured, reason, reasonlen) != 0)
		goto fail;
	msg_fixed_props(&m->props, ev);
	m->exchange = bytes_of(exchange);
	m->routing_key = bytes_of(routing_key);
	return 0;
fail:
	rmq_msg_release(m);
	return -1;
}

void rmq_msg_release(struct rmq_msg *m)
{
	ce_headers_release(&m->ce);
	free(m->entries);
	free(m->structured);
	*m = (struct rmq_msg){0};
}

/* Encoded size of a field table whose values are all long strings. */
static size_t table_size(const amqp_table_t *t)
{
	size_t size = 4; /* the table's own length prefix */

	for (int i = 0; i < t->num_entries; i++) {
		const amqp_table_entry_t *e = &t->entries[i];

		size += 1 + e->key.len + 1; /* key shortstr, type octet */
		size += 4 + e->value.value.bytes.len;
	}
	return size;
}

size_t rmq_msg_header_frame_size(const struct rmq_msg *m)
{
	const amqp_basic_properties_t *p = &m->props;
	const struct {
		amqp_flags_t flag;
		const amqp_bytes_t *s;
	} shortstrs[] = {
	    {AMQP_BASIC_CONTENT_TYPE_FLAG, &p->content_type},
	    {AMQP_BASIC_CONTENT_ENCODING_FLAG, &p->content_encoding},
	    {AMQP_BASIC_CORRELATION_ID_FLAG, &p->correlation_id},
	    {AMQP_BASIC_REPLY_TO_FLAG, &p->reply_to},
	    {AMQP_BASIC_EXPIRATION_FLAG, &p->expiration},
	    {AMQP_BASIC_MESSAGE_ID_FLAG, &p->message_id},
	    {AMQP_BASIC_TYPE_FLAG, &p->type},
	    {AMQP_BASIC_USER_ID_FLAG, &p->user_id},
	    {AMQP_BASIC_APP_ID_FLAG, &p->app_id},
	    {AMQP_BASIC_CLUSTER_ID_FLAG, &p->cluster_id},
	};
	/* frame type, channel, payload size; class, weight, body size,
	 * property flags; frame end. */
	size_t size = 1 + 2 + 4 + 2 + 2 + 8 + 2 + 1;

	for (size_t i = 0; i < sizeof(shortstrs) / sizeof(shortstrs[0]); i++)
		if (p->_flags & shortstrs[i].flag)
			size += 1 + shortstrs[i].s->len;
	if (p->_flags & AMQP_BASIC_HEADERS_FLAG)
		size += table_size(&p->headers);
	if (p->_flags & AMQP_BASIC_DELIVERY_MODE_FLAG)
		size += 1;
	if (p->_flags & AMQP_BASIC_PRIORITY_FLAG)
		size += 1;
	if (p->_flags & AMQP_BASIC_TIMESTAMP_FLAG)
		size += 8;
	return size;
}

int rmq_msg_check_fit(const struct rmq_msg *m, size_t frame_max, char *reason,
		      size_t reasonlen)
{
	size_t size = rmq_msg_header_frame_size(m);

	if (frame_max == 0 || size <= frame_max)
		return 0;
	set_reason(reason, reasonlen,
		   "headers too large: the AMQP content header needs %zu "
		   "bytes, over the broker's frame_max of %zu",
		   size, frame_max);
	return -1;
}

/* Finds lit in s[0..len); returns its offset or -1. */
static long find(const char *s, size_t len, size_t from, const char *lit)
{
	size_t n = strlen(lit);

	for (size_t i = from; i + n <= len; i++)
		if (memcmp(s + i, lit, n) == 0)
			return (long)i;
	return -1;
}

/*
 * Copies the name quoted after `opener` (e.g. "exchange '") and ending at
 * the last "' in <closer>" into out. Names may contain quotes, so the end
 * is the closer's last occurrence. Returns the offset after the name, or
 * -1 when the text has no such name or it does not fit.
 */
static long quoted_name(const char *s, size_t len, size_t from,
			const char *opener, const char *closer, char *out,
			size_t outlen)
{
	long at = find(s, len, from, opener);
	long end = -1, next;
	size_t start, n;

	if (at < 0)
		return -1;
	start = (size_t)at + strlen(opener);
	for (next = find(s, len, start, closer); next >= 0;
	     next = find(s, len, (size_t)next + 1, closer))
		end = next;
	if (end < 0)
		return -1;
	n = (size_t)end - start;
	if (n >= outlen)
		return -1;
	memcpy(out, s + start, n);
	out[n] = '\0';
	return end;
}

static void default_exchange_name(char *exchange)
{
	if (strcmp(exchange, "amq.default") == 0)
		exchange[0] = '\0';
}

/* Parses the decimal number at s[*at..len); advances *at. */
static bool parse_u64(const char *s, size_t len, size_t *at, uint64_t *out)
{
	uint64_t v = 0;
	size_t i = *at;

	if (i >= len || s[i] < '0' || s[i] > '9')
		return false;
	for (; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
		if (v > (UINT64_MAX - 9) / 10)
			return false;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	*at = i;
	*out = v;
	return true;
}

void rmq_refusal_parse(uint16_t code, const char *text, size_t len,
		       struct rmq_refusal *out)
{
	*out = (struct rmq_refusal){.kind = RMQ_REFUSAL_OTHER};
	if (!text)
		return;
	if (code == AMQP_NOT_FOUND || code == AMQP_ACCESS_REFUSED) {
		/* The topic form names the exchange after the key; the
		 * routing key ends at "' in exchange '". */
		long topic = code == AMQP_ACCESS_REFUSED
				 ? find(text, len, 0, "topic '")
				 : -1;

		if (topic >= 0) {
			long after =
			    quoted_name(text, len, (size_t)topic, "topic '",
					"' in exchange '", out->routing_key,
					sizeof(out->routing_key));

			if (after >= 0 &&
			    quoted_name(text, len, (size_t)after,
					"in exchange '", "' in vhost '",
					out->exchange,
					sizeof(out->exchange)) >= 0) {
				default_exchange_name(out->exchange);
				out->kind = RMQ_REFUSAL_ROUTE;
				return;
			}
			*out = (struct rmq_refusal){.kind = RMQ_REFUSAL_OTHER};
			return;
		}
		if (quoted_name(text, len, 0, "exchange '", "' in vhost '",
				out->exchange, sizeof(out->exchange)) >= 0) {
			default_exchange_name(out->exchange);
			out->kind = RMQ_REFUSAL_EXCHANGE;
		}
		return;
	}
	if (code == AMQP_PRECONDITION_FAILED) {
		static const char lead[] = "message size ";
		static const char mid[] =
		    " is larger than configured max size ";
		long at = find(text, len, 0, lead);
		size_t i;
		uint64_t size, max;

		if (at < 0)
			return;
		i = (size_t)at + sizeof(lead) - 1;
		if (!parse_u64(text, len, &i, &size))
			return;
		if (i + sizeof(mid) - 1 > len ||
		    memcmp(text + i, mid, sizeof(mid) - 1) != 0)
			return;
		i += sizeof(mid) - 1;
		if (!parse_u64(text, len, &i, &max) || size <= max)
			return;
		out->kind = RMQ_REFUSAL_TOO_LARGE;
		out->max_size = max;
	}
}

void rmq_map_describe_close(uint16_t code, amqp_bytes_t text, char *buf,
			    size_t len)
{
	char quoted[168];

	cloudevent_quote(quoted, sizeof(quoted), text.bytes, text.len, 160);
	set_reason(buf, len, "%u %s", code, quoted);
}

void rmq_map_describe_reply(amqp_rpc_reply_t r, char *buf, size_t len)
{
	switch (r.reply_type) {
	case AMQP_RESPONSE_NORMAL:
		set_reason(buf, len, "ok");
		return;
	case AMQP_RESPONSE_NONE:
		set_reason(buf, len, "no reply from the library");
		return;
	case AMQP_RESPONSE_LIBRARY_EXCEPTION:
		/* librabbitmq stores the status negated in some paths and
		 * as is in others. */
		set_reason(buf, len, "%s",
			   amqp_error_string2(r.library_error > 0
						  ? -r.library_error
						  : r.library_error));
		return;
	case AMQP_RESPONSE_SERVER_EXCEPTION:
		if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
			const amqp_connection_close_t *c = r.reply.decoded;

			rmq_map_describe_close(c->reply_code, c->reply_text,
					       buf, len);
		} else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
			const amqp_channel_close_t *c = r.reply.decoded;

			rmq_map_describe_close(c->reply_code, c->reply_text,
					       buf, len);
		} else {
			set_reason(buf, len, "unexpected reply %s",
				   amqp_method_name(r.reply.id));
		}
		return;
	}
	set_reason(buf, len, "unknown reply");
}
