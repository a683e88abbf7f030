/* SPDX-License-Identifier: MIT */
/*
 * Internals of the Kafka backend (publisher_kafka in backends.h) that its
 * unit tests exercise: how a row becomes a Kafka record under the
 * CloudEvents Kafka binding, and how librdkafka's error codes map to the
 * outcome classes of publisher.h. Everything here is pure except
 * kafka_handle().
 */
#ifndef OUTBOX_KAFKA_H
#define OUTBOX_KAFKA_H

#include <stdbool.h>
#include <stddef.h>

#include <librdkafka/rdkafka.h>

#include "publisher.h"

/* Which row column becomes the record's key. */
enum kafka_key_from { KEY_FROM_PARTITION_KEY, KEY_FROM_ROUTING_KEY };

/* One librdkafka property passed through OUTBOX_KAFKA_<PROPERTY>. */
struct kafka_prop {
	char *name;  /* dotted, lower case: "sasl.mechanism" */
	char *value; /* as given */
	bool secret; /* value never printed */
};

/* The backend's settings (OUTBOX_KAFKA_*), filled by config_load()
 * through kafka_settings_group and owned by struct config. */
struct kafka_settings {
	char *brokers;
	char *topic; /* default topic for rows with NULL */
	enum kafka_key_from key_from;
	struct kafka_prop *props; /* sorted by name */
	size_t n_props;
};

extern const struct config_group kafka_settings_group;

/* cfg's Kafka settings; all empty when cfg was loaded without them. */
const struct kafka_settings *kafka_settings_of(const struct config *cfg);

/* Logs a warning at startup when the brokers are reached in plaintext
 * while some are not loopback, or with TLS verification off. */
void kafka_settings_warn(const struct config *cfg);

/* True when name is a valid Kafka topic name (kafka_settings.c): 1 to 249 of
 * [A-Za-z0-9._-], not "." or "..". */
bool kafka_topic_valid(const char *name);

/*
 * One row as a Kafka record.
 *
 * Ownership: topic, key and (in binary mode) value borrow from the event
 * and the config and live as long as both; envelope and headers are owned
 * by the struct until kafka_msg_release(). After a successful
 * rd_kafka_producev() the headers belong to librdkafka: set headers to
 * NULL then.
 */
struct kafka_msg {
	const char *topic; /* the row's exchange, or the default */
	const void *key;   /* NULL: no key (sticky partitioning) */
	size_t key_len;
	const void *value; /* never NULL; may be zero bytes */
	size_t value_len;
	char *envelope;		     /* structured mode: value's storage */
	rd_kafka_headers_t *headers; /* ce_* or content-type, row headers */
};

/*
 * Builds the record for ev:
 *  - topic: ev->exchange, or OUTBOX_KAFKA_TOPIC when it is NULL; a name that
 *    is not a valid Kafka topic name fails the row (PUB_PERMANENT);
 *  - key: the partition key, or with OUTBOX_KAFKA_KEY_FROM=routing_key the
 *    routing key; NULL or "" means no key;
 *  - binary mode (default): value = payload, headers ce_specversion, ce_id,
 *    ce_source, ce_type, ce_time, ce_subject, ce_partitionkey (those set),
 *    content-type = the row's content type (when set), then the row's
 *    headers;
 *  - structured mode: value = the JSON envelope, headers content-type =
 *    application/cloudevents+json; charset=UTF-8, then the row's headers.
 * The partition key is sent as ce_partitionkey even when the key comes
 * from the routing key: the key mapper never changes the event.
 *
 * Returns 0 with msg filled, or -1 with *fail set (PUB_PERMANENT: the row
 * can never be sent; PUB_NOT_WRITTEN: out of memory) and reason set (a
 * printable ASCII line fit for last_error). msg is always safe to
 * kafka_msg_release().
 */
int kafka_msg_build(const struct config *cfg, const struct outbox_event *ev,
		    struct kafka_msg *msg, enum pub_outcome *fail, char *reason,
		    size_t reasonlen);

/* Where rows with a NULL exchange go: OUTBOX_KAFKA_TOPIC. */
const char *kafka_default_destination(const struct config *cfg);

/* Frees what kafka_msg_build() stored; leaves msg zeroed. */
void kafka_msg_release(struct kafka_msg *msg);

/*
 * The outcome class of a delivery report (err != 0; 0 is PUB_ACKED):
 *  - the record itself is refused (too large, invalid, corrupt):
 *    PUB_PERMANENT;
 *  - the topic is refused (unknown topic or partition, not authorized,
 *    cannot take this record format or compression): PUB_DESTINATION;
 *  - a broker policy or timestamp check refused it: PUB_EVENT;
 *  - anything else (timeouts, lost connections, too few replicas, our own
 *    purge, unknown codes): PUB_NOT_WRITTEN when librdkafka reports the
 *    record NOT_PERSISTED, which it does only when it was never sent or the
 *    broker said it was not written; else PUB_TRANSPORT. A fatal producer
 *    error (ERR__FATAL) is always PUB_TRANSPORT.
 */
enum pub_outcome kafka_delivery_outcome(rd_kafka_resp_err_t err,
					rd_kafka_msg_status_t status);

/*
 * The outcome class of an error returned by rd_kafka_producev() itself,
 * when nothing was enqueued: PUB_PERMANENT for a record over
 * message.max.bytes, PUB_DESTINATION for a topic or partition known not to
 * exist, PUB_NOT_WRITTEN for a full queue or a producer in a fatal state
 * (the row is not at fault), PUB_EVENT for any other refusal (so a row that
 * always trips one fails once its attempts are spent instead of looping).
 */
enum pub_outcome kafka_produce_outcome(rd_kafka_resp_err_t err);

/* Copies in into out, bytes outside printable ASCII replaced by '?', so a
 * reason is always valid UTF-8 for last_error and logs. */
void kafka_ascii_copy(char *out, size_t outlen, const char *in);

/* Writes "<what>: <librdkafka's text> (<ERROR_NAME>)" into buf, printable
 * ASCII only. */
void kafka_reason(char *buf, size_t buflen, const char *what,
		  rd_kafka_resp_err_t err);

/* The producer of an open publisher state (tests reach the mock cluster
 * through it); NULL while it is being recreated. */
rd_kafka_t *kafka_handle(void *state);

/* The librdkafka property an OUTBOX_KAFKA_<PROPERTY> variable set under
 * cfg (name as librdkafka spells it), or NULL. */
const struct kafka_prop *kafka_prop_find(const struct config *cfg,
					 const char *name);

/* The producer configuration for cfg: every OUTBOX_KAFKA_<PROPERTY>, then
 * what the relay insists on and its defaults; bootstrap.servers too when
 * brokers is true. A conf owned by the caller, or NULL with err naming the
 * variable at fault (never a secret value). */
rd_kafka_conf_t *kafka_conf_build(const struct config *cfg, bool brokers,
				  char *err, size_t errlen);

/* How soon a silent broker connection is given up, and so the producer's
 * socket timeouts unless set: a quarter of the lease timeout, within
 * these bounds (README, "Cut links and half-open connections"). */
#define KAFKA_DEAD_PEER_MIN_MS 1000
#define KAFKA_DEAD_PEER_MAX_MS 30000
int64_t kafka_dead_peer_ms(const struct config *cfg);

#endif
