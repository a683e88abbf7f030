/* SPDX-License-Identifier: MIT */
/*
 * The Kafka form of an outbox event (CloudEvents Kafka binding) and the
 * outcome classes of librdkafka's error codes; pure functions, no
 * producer (see kafka.h). Sits above kafka_settings.c: it reads the
 * settings and checks a row's topic with the settings' own topic rule,
 * and nothing there calls back here.
 */
#include "kafka.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "encode/encode.h"

#define CE_PREFIX "ce_"

/* ---- pure mapping ---- */

void kafka_ascii_copy(char *out, size_t outlen, const char *in)
{
	size_t j = 0;

	if (outlen == 0)
		return;
	for (size_t i = 0; in && in[i] && j + 1 < outlen; i++) {
		unsigned char c = (unsigned char)in[i];
		out[j++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
	}
	out[j] = '\0';
}

void kafka_reason(char *buf, size_t buflen, const char *what,
		  rd_kafka_resp_err_t err)
{
	char tmp[512];

	snprintf(tmp, sizeof(tmp), "%s: %s (%s)", what, rd_kafka_err2str(err),
		 rd_kafka_err2name(err));
	kafka_ascii_copy(buf, buflen, tmp);
}

enum pub_outcome kafka_delivery_outcome(rd_kafka_resp_err_t err,
					rd_kafka_msg_status_t status)
{
	switch (err) {
	case RD_KAFKA_RESP_ERR_NO_ERROR:
		return PUB_ACKED;
	/* The record itself: no retry can change its size or bytes. */
	case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
	case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
	case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
	case RD_KAFKA_RESP_ERR_INVALID_RECORD:
	case RD_KAFKA_RESP_ERR_INVALID_MSG: /* CORRUPT_MESSAGE, code 2 */
		return PUB_PERMANENT;
	/* The topic: every row addressed there would fail alike, so the
	 * topic is paused instead of failing a whole backlog. Nothing was
	 * written. */
	case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
	case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
	case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
	case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
	case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
	case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
	case RD_KAFKA_RESP_ERR_UNSUPPORTED_COMPRESSION_TYPE:
		return PUB_DESTINATION;
	/* The broker looked at this record and said no. */
	case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
	case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
		return PUB_EVENT;
	/* The producer died with records in it: whatever their status says,
	 * the rows keep their charge. */
	case RD_KAFKA_RESP_ERR__FATAL:
		return PUB_TRANSPORT;
	default:
		break;
	}
	/* Timeouts, lost connections, too few replicas, purges and codes we
	 * do not know: the cluster's fault. librdkafka reports NOT_PERSISTED
	 * only for a record never sent or one the broker said it did not
	 * write, so only then may the attempt be given back. */
	return status == RD_KAFKA_MSG_STATUS_NOT_PERSISTED ? PUB_NOT_WRITTEN
							   : PUB_TRANSPORT;
}

enum pub_outcome kafka_produce_outcome(rd_kafka_resp_err_t err)
{
	switch (err) {
	case RD_KAFKA_RESP_ERR_NO_ERROR:
		return PUB_ACKED;
	case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		return PUB_PERMANENT;
	case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
	case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
	case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
	case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
		return PUB_DESTINATION;
	case RD_KAFKA_RESP_ERR__QUEUE_FULL:
	case RD_KAFKA_RESP_ERR__FATAL:
		return PUB_NOT_WRITTEN;
	default:
		return PUB_EVENT;
	}
}

static int header_add(rd_kafka_headers_t *h, const char *name,
		      const char *value)
{
	return rd_kafka_header_add(h, name, -1, value, -1) ? -1 : 0;
}

static bool is_attribute(const struct ce_header *h)
{
	/* Row headers can never start with ce_ (cloudevent_validate refuses
	 * them), so the prefix tells attributes from row headers. */
	return strncmp(h->name, CE_PREFIX, strlen(CE_PREFIX)) == 0;
}

/* Value and headers: the envelope, or the payload with ce_* headers; the
 * row's own headers follow either. 0, or -1 with reason set. */
static int msg_body(struct kafka_msg *msg, const struct outbox_event *ev,
		    const struct ce_headers *ce, bool structured, char *reason,
		    size_t reasonlen)
{
	static const char empty[] = "";
	size_t len = 0;

	if (structured) {
		/* The envelope carries the attributes; ce_* headers are
		 * optional in this mode and left out. */
		msg->envelope =
		    cloudevent_structured(ev, &len, reason, reasonlen);
		if (!msg->envelope)
			return -1;
		msg->value = msg->envelope;
		msg->value_len = len;
		if (header_add(msg->headers, "content-type",
			       cloudevent_structured_content_type()) != 0)
			goto oom;
	} else {
		msg->value = ev->payload ? (const void *)ev->payload : empty;
		msg->value_len = ev->payload ? ev->payload_len : 0;
		for (size_t i = 0; i < ce->n; i++)
			if (is_attribute(&ce->items[i]) &&
			    header_add(msg->headers, ce->items[i].name,
				       ce->items[i].value) != 0)
				goto oom;
		if (ev->content_type && *ev->content_type &&
		    header_add(msg->headers, "content-type",
			       ev->content_type) != 0)
			goto oom;
	}
	for (size_t i = 0; i < ce->n; i++)
		if (!is_attribute(&ce->items[i]) &&
		    header_add(msg->headers, ce->items[i].name,
			       ce->items[i].value) != 0)
			goto oom;
	return 0;
oom:
	snprintf(reason, reasonlen, "out of memory");
	return -1;
}

/* Rows with a NULL exchange go to OUTBOX_KAFKA_TOPIC. */
const char *kafka_default_destination(const struct config *cfg)
{
	return kafka_settings_of(cfg)->topic;
}

int kafka_msg_build(const struct config *cfg, const struct outbox_event *ev,
		    struct kafka_msg *msg, enum pub_outcome *fail, char *reason,
		    size_t reasonlen)
{
	const struct kafka_settings *ks = kafka_settings_of(cfg);
	struct ce_headers ce = {0};
	const char *topic =
	    ev->exchange ? ev->exchange : kafka_default_destination(cfg);
	const char *key;
	int ret = -1;

	*msg = (struct kafka_msg){0};
	*fail = PUB_PERMANENT;
	if (!kafka_topic_valid(topic)) {
		char shown[80];

		kafka_ascii_copy(shown, sizeof(shown), topic ? topic : "");
		snprintf(reason, reasonlen,
			 "exchange '%s' is not a valid Kafka topic name (1 to "
			 "249 of [A-Za-z0-9._-], not . or ..)",
			 shown);
		goto out;
	}
	/* The encoder checks the row as cloudevent_validate() does (the
	 * worker has, so this is the second and last look at it): a refusal
	 * is the row's, unless memory ran out: retried with backoff, charged,
	 * so that a row that always needs more ends at max_attempts. */
	if (cloudevent_binary_headers(ev, CE_PREFIX, &ce, reason, reasonlen) !=
	    0) {
		if (strcmp(reason, CLOUDEVENT_NO_MEMORY) == 0)
			*fail = PUB_EVENT;
		goto out;
	}
	/* The row is valid, so every failure from here on is memory. */
	*fail = PUB_EVENT;

	msg->topic = topic;
	key = ks->key_from == KEY_FROM_ROUTING_KEY ? ev->routing_key
						   : ev->partition_key;
	if (key && *key) {
		msg->key = key;
		msg->key_len = strlen(key);
	}
	msg->headers = rd_kafka_headers_new(ce.n + 1);
	if (!msg->headers) {
		snprintf(reason, reasonlen, "out of memory");
		goto out;
	}
	if (msg_body(msg, ev, &ce, cfg->ce_mode == CE_MODE_STRUCTURED, reason,
		     reasonlen) != 0)
		goto out;
	ret = 0;
out:
	ce_headers_release(&ce);
	if (ret != 0)
		kafka_msg_release(msg);
	return ret;
}

void kafka_msg_release(struct kafka_msg *msg)
{
	if (msg->headers)
		rd_kafka_headers_destroy(msg->headers);
	free(msg->envelope);
	*msg = (struct kafka_msg){0};
}
