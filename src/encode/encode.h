/* SPDX-License-Identifier: MIT */
/*
 * CloudEvents 1.0 encoding of a leased outbox row: the check every backend
 * runs before handing a row over, the attribute headers of binary content
 * mode and the JSON envelope of structured content mode. Knows no broker:
 * the header prefix and where content-type goes are the transport's call.
 *
 * Threading: every function is reentrant; nothing here keeps state.
 */
#ifndef OUTBOX_CLOUDEVENT_H
#define OUTBOX_CLOUDEVENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"

/*
 * How the row maps to attributes (all functions below agree on it):
 * id, source, type are required and must be non-empty; time is written
 * when ev->time is non-empty; subject and partitionkey are written when
 * non-NULL and non-empty (CloudEvents forbids empty values, so '' in the
 * column means absent); datacontenttype is ev->content_type, left out when
 * NULL or empty. Every String attribute (content_type included) must be
 * valid UTF-8 without control characters or Unicode noncharacters.
 *
 * ev->headers_json is the headers column: a JSON object of string values,
 * NULL meaning no headers. A header name must be non-empty, valid UTF-8
 * without control characters, unique, and must not collide with what the
 * relay writes itself: names starting with "ce_", "ce-" or "cloudEvents",
 * or equal to "content-type", compared ASCII case-insensitively. Header
 * values must be valid UTF-8; traceparent and tracestate (matched exactly,
 * lower case) become CloudEvents attributes in structured mode and so must
 * also be free of control characters.
 *
 * source must also be a URI-reference (cloudevent_uri_reference_problem()).
 * exchange (when not NULL) and routing_key must hold no control character
 * (C0 or DEL): they reach broker frames and log lines, and tables made
 * without migration 003's CHECKs can hold them.
 */

/*
 * RFC 3986 URI-reference syntax (`source` is one in CloudEvents 1.0):
 * returns NULL when s is one, or why with what is wrong first ("a space in
 * the path"), never quoting s.
 */
const char *cloudevent_uri_reference_problem(const char *s, char *why,
					     size_t whylen);

/*
 * datacontenttype's syntax: an RFC 2046 media type, type "/" subtype,
 * then parameters (not checked); and not application/cloudevents..., the
 * type of a whole event, with which a binary-mode message reads as
 * structured mode. Returns NULL when s is fine, or why ("is not a media
 * type ...").
 */
const char *cloudevent_media_type_problem(const char *s);

/* The longest OUTBOX_CE_SOURCE accepted, in bytes. */
#define CLOUDEVENT_SOURCE_MAX 1024

/*
 * The settings check of OUTBOX_CE_SOURCE (lent to config through struct
 * config_extensions): a non-empty URI-reference of at most
 * CLOUDEVENT_SOURCE_MAX bytes. 0, or -1 with why set.
 */
int cloudevent_source_check(const char *v, char *why, size_t whylen);

/* The reason every function here gives when memory ran out: the one
 * refusal that is not the row's (a caller retries the row). */
#define CLOUDEVENT_NO_MEMORY "out of memory"

/*
 * cJSON allocates through the encoder's hooks (json_memory.c), which note
 * per thread when memory ran out: watch() clears the note, ran_out() says
 * whether an allocation failed since. A cJSON call that returned NULL
 * with the note set failed for memory, not for its input.
 */
void encode_json_memory_watch(void);
bool encode_json_memory_ran_out(void);

/* 1 when cJSON parses all of p[0..n) as one JSON value (blanks may
 * follow it), 0 when not, -1 when memory ran out. */
int encode_json_value_parses(const unsigned char *p, size_t n);

/* src[0..n) without the blanks between tokens into dst (room for n
 * bytes): its length, or SIZE_MAX when the text is not strict JSON in a
 * way cJSON lets through (json_text.c). */
size_t encode_json_compact(const unsigned char *src, size_t n, char *dst);

/* What is wrong with JSON text s's \u escapes (one cJSON would decode
 * into a NUL, or not four hex digits), or NULL (json_text.c). */
const char *encode_json_u_escape_problem(const char *s);

/*
 * Bytes the row puts into its event: the payload, the headers' JSON text
 * and the attributes it carries (type, source, subject, content type,
 * partition key); what OUTBOX_MAX_EVENT_SIZE bounds. Brokers count
 * headers and attributes in their message limits too. Reads no more than
 * the lengths, so a row too large is refused before it is parsed.
 */
size_t cloudevent_row_bytes(const struct outbox_event *ev);

/*
 * Checks that ev can be encoded. Returns 0, or -1 with a short lowercase
 * reason (fit for last_error, always valid UTF-8) in reason, e.g.
 * `header "ce-id" collides with a CloudEvents attribute`. reason may be
 * NULL when reasonlen is 0.
 */
int cloudevent_validate(const struct outbox_event *ev, char *reason,
			size_t reasonlen);

/* One transport header of binary content mode. */
struct ce_header {
	char *name;  /* points into the list's allocation */
	char *value; /* likewise */
};

/* The headers a transport sends in binary content mode, in order. */
struct ce_headers {
	struct ce_header *items; /* owned: one allocation holding the items
				    and every name and value */
	size_t n;
};

/*
 * Fills out with, in this order: prefix+"specversion" = "1.0", prefix+"id",
 * prefix+"source", prefix+"type", prefix+"time" (when set),
 * prefix+"subject" (when set), prefix+"partitionkey" (when set), then every
 * row header verbatim under its own name (traceparent and tracestate
 * included). content-type is not in the list: the transport carries
 * datacontenttype where its binding says (AMQP basic property, Kafka
 * header). prefix is "ce-" or "cloudEvents_" for AMQP, "ce_" for Kafka;
 * not NULL.
 *
 * Returns 0 with out owned by the caller (release with
 * ce_headers_release()), or -1 with reason set and out left empty. The row
 * is validated as cloudevent_validate() does, so after that call succeeded
 * a failure here means memory ran out (reason "out of memory").
 */
int cloudevent_binary_headers(const struct outbox_event *ev, const char *prefix,
			      struct ce_headers *out, char *reason,
			      size_t reasonlen);

/* Frees what cloudevent_binary_headers() stored; leaves h empty. Accepts
 * an empty or zeroed h. */
void ce_headers_release(struct ce_headers *h);

/*
 * The structured-mode envelope: one compact JSON object on a single line,
 * no trailing newline, members in this order: specversion "1.0", id,
 * source, type, time, subject, datacontenttype, partitionkey, traceparent
 * and tracestate (from the row headers, when present and non-empty), then
 * the data:
 *  - "data" holding the payload verbatim (whitespace between tokens
 *    removed) when content_type is a JSON type (cloudevent_is_json_type())
 *    and the payload is strict JSON text (RFC 8259, UTF-8, no byte-order
 *    mark);
 *  - otherwise "data_base64" holding the payload in base64. An empty
 *    payload is always "data_base64":"" (zero bytes of data, which is not
 *    the same as no data), whatever its content type.
 * Other row headers are transport headers and are not in the envelope.
 *
 * Returns a buffer from malloc() owned by the caller (free()), holding *len
 * bytes followed by a NUL that also belongs to the buffer (so a caller may
 * overwrite it with '\n' and write len + 1 bytes). Returns NULL with reason
 * set when the row is invalid (as cloudevent_validate()) or memory ran
 * out ("out of memory").
 */
char *cloudevent_structured(const struct outbox_event *ev, size_t *len,
			    char *reason, size_t reasonlen);

/* The content type of a structured-mode message:
 * "application/cloudevents+json; charset=UTF-8". Static storage. */
const char *cloudevent_structured_content_type(void);

/*
 * True when content_type names JSON data: "application/json", "text/json"
 * or any "type/subtype+json", compared case-insensitively, parameters
 * (after ';') and surrounding blanks ignored. NULL and "" are not JSON.
 */
bool cloudevent_is_json_type(const char *content_type);

/*
 * Copies at most max bytes of s[0..len) into dst (dstlen > 3) for quoting
 * in a reason: the cut falls on a UTF-8 character boundary (marked with
 * "..."), and invalid bytes, control characters (C0, DEL and C1), double
 * quotes and backslashes become '?', so reasons stay valid UTF-8 on one
 * line whatever a row or a broker sent.
 */
void cloudevent_quote(char *dst, size_t dstlen, const char *s, size_t len,
		      size_t max);

#endif
