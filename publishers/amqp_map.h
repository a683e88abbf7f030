/* SPDX-License-Identifier: MIT */
/*
 * The AMQP 0-9-1 form of an outbox event (destination, basic properties,
 * header table, body) and the reading of RabbitMQ's channel-error texts.
 * Pure functions over librabbitmq's types: no connection and no I/O, so
 * the mapping is unit-tested without a broker (publishers/amqp.c does the
 * talking).
 *
 * Threading: reentrant; nothing here keeps state.
 */
#ifndef OUTBOX_AMQP_MAP_H
#define OUTBOX_AMQP_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <amqp.h>
#include <amqp_framing.h>

#include "encode/encode.h"
#include "config/config.h"
#include "base/base.h"

/* What an unroutable (returned) message does to its row. */
enum rmq_unroutable { UNROUTABLE_RETRY, UNROUTABLE_FAIL };

/* How the relay logs in: PLAIN sends the URL's user and password,
 * EXTERNAL lets the broker take the name from the TLS client certificate. */
enum rmq_sasl { RMQ_SASL_PLAIN, RMQ_SASL_EXTERNAL };

/* The backend's settings (OUTBOX_AMQP_*, OUTBOX_UNROUTABLE), filled by
 * config_load() through rmq_settings_group and owned by struct config. */
struct rmq_settings {
	char *url;
	char *exchange;	       /* default exchange for rows with NULL */
	bool declare_exchange; /* declare exchange at open */
	char *header_prefix;   /* "ce-" (default) or "cloudEvents_" */
	enum rmq_unroutable unroutable;
	/* amqps:// only (rmq_settings_check() refuses them otherwise). */
	char *tls_ca_file;   /* NULL: the system's CA bundle */
	char *tls_cert_file; /* client certificate chain, or NULL */
	char *tls_key_file;  /* its private key: set with tls_cert_file */
	bool tls_verify;     /* peer and host name; off is warned about */
	enum rmq_sasl sasl;
	/* Proposed heartbeat, whole seconds; the connection takes the lower
	 * of it and the broker's. Two silent ones and the link is dead. */
	int64_t heartbeat_ms;
};

extern const struct config_group rmq_settings_group;

/* cfg's AMQP settings; all empty when cfg was loaded without them. */
const struct rmq_settings *rmq_settings_of(const struct config *cfg);

/* The parser the backend connects with, so what passes here connects: 0,
 * or -1 with why set (never quoting the URL, which holds a password). */
int rmq_url_check(const char *url, char *why, size_t whylen);

/* The settings' cross-checks (URL scheme against the TLS settings, a
 * client certificate with its key, EXTERNAL with a certificate): 0, or
 * -1 with err naming the variables. */
int rmq_settings_check(const struct rmq_settings *as, char *err, size_t errlen);

/* Logs one warning per weakness of the broker link at startup: TLS
 * verification turned off, or plaintext to a host that is not loopback. */
void rmq_settings_warn(const struct rmq_settings *as);

/* basic.properties app-id of every message the relay publishes. */
#define RMQ_MAP_APP_ID "outbox-relay"

/*
 * One event as it goes on the wire.
 *
 * Ownership: exchange, routing_key and the property strings point into
 * the event, the configuration, static storage or the fields marked owned
 * below; the message lives no longer than the event and the config it was
 * built from. Release with rmq_msg_release().
 */
struct rmq_msg {
	amqp_bytes_t exchange; /* "" is the default exchange */
	amqp_bytes_t routing_key;
	amqp_basic_properties_t props; /* headers.entries is `entries` */
	amqp_bytes_t body;	       /* the payload, or `structured` */
	struct ce_headers ce;	       /* owned: strings of the table */
	amqp_table_entry_t *entries;   /* owned */
	char *structured;	       /* owned: structured-mode body */
};

/*
 * Builds the message for ev under cfg:
 *  - exchange: ev->exchange, or the OUTBOX_AMQP_EXCHANGE when NULL;
 *    routing key: ev->routing_key;
 *  - binary mode (CE_MODE_BINARY): body = payload; headers = the list of
 *    cloudevent_binary_headers(ev, OUTBOX_AMQP_HEADER_PREFIX) as long
 *    strings (row headers, traceparent and tracestate included, pass
 *    through under their own names); content_type = ev->content_type
 *    (left out when NULL or empty);
 *  - structured mode: body = cloudevent_structured(ev); content_type =
 *    cloudevent_structured_content_type(); headers = the row headers only;
 *  - both: delivery_mode 2 (persistent), message_id = id, timestamp =
 *    created_at in seconds, type = CloudEvents type, app_id
 *    RMQ_MAP_APP_ID. message_id and type are left out when longer than
 *    the 255 bytes of an AMQP short string (the ce headers carry them).
 *
 * Returns 0 with m filled, or -1 with a reason fit for last_error and m
 * left empty: the row cannot be encoded (as cloudevent_validate() says),
 * or a name is longer than 255 bytes (exchange, routing key, content type,
 * header name), or memory ran out (reason "out of memory"; the only
 * failure that is not the row's fault).
 */
int rmq_msg_build(const struct config *cfg, const struct outbox_event *ev,
		  struct rmq_msg *m, char *reason, size_t reasonlen);

/* Frees what rmq_msg_build() allocated; leaves m empty. Accepts an
 * empty or zeroed m. */
void rmq_msg_release(struct rmq_msg *m);

/* Bytes of the content-header frame that carries m's properties, frame
 * envelope included: it must fit in the connection's frame_max. */
size_t rmq_msg_header_frame_size(const struct rmq_msg *m);

/*
 * Checks that m's content header fits in one frame of frame_max bytes
 * (AMQP sends properties in exactly one frame). Returns 0, or -1 with a
 * reason naming both sizes.
 */
int rmq_msg_check_fit(const struct rmq_msg *m, size_t frame_max, char *reason,
		      size_t reasonlen);

/* What a broker's channel.close says about the messages in flight. */
enum rmq_refusal_kind {
	/* Nothing we can pin on one destination or message. */
	RMQ_REFUSAL_OTHER,
	/* 404 no exchange, 403 access to exchange refused: every message
	 * to `exchange` is refused. */
	RMQ_REFUSAL_EXCHANGE,
	/* 403 topic authorisation: messages to `exchange` with
	 * `routing_key` are refused. */
	RMQ_REFUSAL_ROUTE,
	/* 406 a message body is over the broker's max_message_size
	 * (`max_size`). */
	RMQ_REFUSAL_TOO_LARGE,
};

struct rmq_refusal {
	enum rmq_refusal_kind kind;
	char exchange[256];    /* EXCHANGE, ROUTE; "" = the default exchange */
	char routing_key[256]; /* ROUTE */
	uint64_t max_size;     /* TOO_LARGE */
};

/*
 * Reads RabbitMQ's channel.close reply (code and text, text not
 * NUL-terminated) into out. Knows the texts of RabbitMQ 3.x:
 *   404 "NOT_FOUND - no exchange 'X' in vhost 'V'"
 *   403 "ACCESS_REFUSED - access to exchange 'X' in vhost 'V' refused ..."
 *   403 "ACCESS_REFUSED - access to topic 'K' in exchange 'X' in vhost ..."
 *   406 "PRECONDITION_FAILED - message size N is larger than configured
 *        max size M"
 * The default exchange is named "amq.default" in these texts and comes
 * back as "". Anything else is RMQ_REFUSAL_OTHER.
 */
void rmq_refusal_parse(uint16_t code, const char *text, size_t len,
		       struct rmq_refusal *out);

/* Drops a UTF-8 character left incomplete at the end of s (what a cut by
 * snprintf leaves), so a truncated reason stays valid UTF-8. */
void rmq_map_utf8_cut(char *s);

/* "CODE text" of a connection.close or channel.close, the text quoted
 * (controls replaced) and cut to 160 bytes. */
void rmq_map_describe_close(uint16_t code, amqp_bytes_t text, char *buf,
			    size_t len);

/* What an RPC reply says went wrong: the library's status text, the
 * broker's close code and text, or "ok" for a normal reply. */
void rmq_map_describe_reply(amqp_rpc_reply_t r, char *buf, size_t len);

#endif
