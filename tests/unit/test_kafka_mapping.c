/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the Kafka backend's pure parts: a row as a Kafka record
 * (CloudEvents Kafka binding, key mapping, topic choice), librdkafka error
 * codes as outcome classes, and the startup check of OUTBOX_KAFKA_*.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <cJSON.h>

#include "encode/encode_test.h"
#include "publishers/backends.h"
#include "publishers/kafka.h"

static const unsigned char body[] = "{\"n\": 1}";

/* The backend's settings of the config below; reset by cfg_base(). */
static struct kafka_settings settings;

static struct config cfg_base(void)
{
	settings = (struct kafka_settings){
	    .brokers = (char *)"127.0.0.1:1",
	    .topic = (char *)"orders",
	    .key_from = KEY_FROM_PARTITION_KEY,
	};
	return (struct config){
	    .publisher = (char *)"kafka",
	    .parts = {{&kafka_settings_group, &settings}},
	    .n_parts = 1,
	    .ce_mode = CE_MODE_BINARY,
	    .publish_timeout_ms = 5000,
	};
}

static struct outbox_event event_base(void)
{
	return (struct outbox_event){
	    .id = "0190a1b2-0000-7000-8000-000000000001",
	    .seq = 1,
	    .type = "com.example.order.created.v1",
	    .source = "urn:test",
	    .subject = "order/42",
	    .content_type = "application/json",
	    .exchange = NULL,
	    .routing_key = "orders.created",
	    .partition_key = "order-42",
	    .payload = body,
	    .payload_len = sizeof(body) - 1,
	    .headers_json = "{\"traceparent\":\"00-4bf92f3577b34da6a3ce929d0e0e"
			    "4736-00f067aa0ba902b7-01\",\"x-tenant\":\"acme\"}",
	    .time = "2024-05-01T12:34:56.789000Z",
	    .attempts = 1,
	    .max_attempts = 10,
	};
}

/* The record's headers as "name=value" lines, in order. */
static void headers_text(const struct kafka_msg *m, char *out, size_t outlen)
{
	const char *name;
	const void *value;
	size_t size;
	size_t used = 0;

	out[0] = '\0';
	for (size_t i = 0;
	     rd_kafka_header_get_all(m->headers, i, &name, &value, &size) == 0;
	     i++) {
		int w = snprintf(out + used, outlen - used, "%s=%.*s\n", name,
				 (int)size, (const char *)value);
		assert_true(w > 0 && (size_t)w < outlen - used);
		used += (size_t)w;
	}
}

static void build_ok(const struct config *cfg, const struct outbox_event *ev,
		     struct kafka_msg *m)
{
	enum pub_outcome fail = PUB_ACKED;
	char reason[256] = "";
	int rc = kafka_msg_build(cfg, ev, m, &fail, reason, sizeof(reason));

	if (rc != 0)
		fail_msg("kafka_msg_build failed: %s", reason);
}

static void test_binary_mode(void **unused)
{
	struct config cfg = cfg_base();
	struct outbox_event ev = event_base();
	struct kafka_msg m;
	char text[2048];

	(void)unused;
	build_ok(&cfg, &ev, &m);
	assert_string_equal(m.topic, "orders");
	assert_int_equal(m.key_len, strlen("order-42"));
	assert_memory_equal(m.key, "order-42", m.key_len);
	/* Binary mode: the payload verbatim is the value. */
	assert_int_equal(m.value_len, sizeof(body) - 1);
	assert_memory_equal(m.value, body, m.value_len);
	assert_null(m.envelope);
	headers_text(&m, text, sizeof(text));
	assert_string_equal(text,
			    "ce_specversion=1.0\n"
			    "ce_id=0190a1b2-0000-7000-8000-000000000001\n"
			    "ce_source=urn:test\n"
			    "ce_type=com.example.order.created.v1\n"
			    "ce_time=2024-05-01T12:34:56.789000Z\n"
			    "ce_subject=order/42\n"
			    "ce_partitionkey=order-42\n"
			    "content-type=application/json\n"
			    "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-"
			    "00f067aa0ba902b7-01\n"
			    "x-tenant=acme\n");
	kafka_msg_release(&m);
	assert_null(m.headers);
}

static void test_binary_optional_attributes(void **unused)
{
	struct config cfg = cfg_base();
	struct outbox_event ev = event_base();
	struct kafka_msg m;
	char text[2048];

	(void)unused;
	ev.subject = NULL;
	ev.partition_key = NULL;
	ev.content_type = "";
	ev.headers_json = "{}";
	ev.payload = NULL;
	ev.payload_len = 0;
	build_ok(&cfg, &ev, &m);
	/* No partition key: no key, so librdkafka partitions stickily. */
	assert_null(m.key);
	assert_int_equal(m.key_len, 0);
	/* An empty payload is an empty value, never a null (tombstone). */
	assert_non_null(m.value);
	assert_int_equal(m.value_len, 0);
	headers_text(&m, text, sizeof(text));
	assert_string_equal(text, "ce_specversion=1.0\n"
				  "ce_id=0190a1b2-0000-7000-8000-000000000001\n"
				  "ce_source=urn:test\n"
				  "ce_type=com.example.order.created.v1\n"
				  "ce_time=2024-05-01T12:34:56.789000Z\n");
	kafka_msg_release(&m);

	/* '' in the partition_key column is absent too. */
	ev.partition_key = "";
	build_ok(&cfg, &ev, &m);
	assert_null(m.key);
	kafka_msg_release(&m);
}

static void test_key_from_routing_key(void **unused)
{
	struct config cfg = cfg_base();
	struct outbox_event ev = event_base();
	struct kafka_msg m;
	char text[2048];

	(void)unused;
	settings.key_from = KEY_FROM_ROUTING_KEY;
	build_ok(&cfg, &ev, &m);
	assert_int_equal(m.key_len, strlen("orders.created"));
	assert_memory_equal(m.key, "orders.created", m.key_len);
	/* The key mapper never changes the event: partitionkey stays. */
	headers_text(&m, text, sizeof(text));
	assert_non_null(strstr(text, "ce_partitionkey=order-42\n"));
	assert_null(strstr(text, "orders.created"));
	kafka_msg_release(&m);

	ev.routing_key = "";
	build_ok(&cfg, &ev, &m);
	assert_null(m.key);
	kafka_msg_release(&m);
}

static void test_structured_mode(void **unused)
{
	struct config cfg = cfg_base();
	struct outbox_event ev = event_base();
	struct kafka_msg m;
	char text[2048];
	char *value;
	cJSON *doc;

	(void)unused;
	cfg.ce_mode = CE_MODE_STRUCTURED;
	build_ok(&cfg, &ev, &m);
	assert_non_null(m.envelope);
	assert_ptr_equal(m.value, m.envelope);
	/* The key is set the same way in both modes. */
	assert_memory_equal(m.key, "order-42", m.key_len);
	headers_text(&m, text, sizeof(text));
	assert_string_equal(
	    text, "content-type=application/cloudevents+json; charset=UTF-8\n"
		  "traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-"
		  "00f067aa0ba902b7-01\n"
		  "x-tenant=acme\n");
	value = strndup(m.value, m.value_len);
	assert_non_null(value);
	doc = cJSON_Parse(value);
	assert_non_null(doc);
	assert_string_equal(
	    cJSON_GetObjectItemCaseSensitive(doc, "specversion")->valuestring,
	    "1.0");
	assert_string_equal(
	    cJSON_GetObjectItemCaseSensitive(doc, "id")->valuestring, ev.id);
	assert_string_equal(
	    cJSON_GetObjectItemCaseSensitive(doc, "type")->valuestring,
	    ev.type);
	assert_string_equal(
	    cJSON_GetObjectItemCaseSensitive(doc, "partitionkey")->valuestring,
	    "order-42");
	assert_int_equal(cJSON_GetObjectItemCaseSensitive(
			     cJSON_GetObjectItemCaseSensitive(doc, "data"), "n")
			     ->valueint,
			 1);
	cJSON_Delete(doc);
	free(value);
	kafka_msg_release(&m);
	assert_null(m.envelope);
}

static void test_topic_choice(void **unused)
{
	struct config cfg = cfg_base();
	struct outbox_event ev = event_base();
	struct kafka_msg m;
	enum pub_outcome fail = PUB_ACKED;
	char reason[256];
	static const char *const bad[] = {"",	       ".",   "..",
					  "bad topic", "x\n", "caf\xc3\xa9"};

	(void)unused;
	ev.exchange = "payments.v1";
	build_ok(&cfg, &ev, &m);
	assert_string_equal(m.topic, "payments.v1");
	kafka_msg_release(&m);

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		ev.exchange = bad[i];
		reason[0] = '\0';
		assert_int_equal(kafka_msg_build(&cfg, &ev, &m, &fail, reason,
						 sizeof(reason)),
				 -1);
		assert_int_equal(fail, PUB_PERMANENT);
		assert_non_null(strstr(reason, "not a valid Kafka topic name"));
		/* Printable ASCII only, fit for last_error. */
		for (const char *p = reason; *p; p++)
			assert_true(*p >= 0x20 && *p < 0x7f);
		assert_null(m.headers);
	}
	assert_true(kafka_topic_valid("a"));
	assert_true(kafka_topic_valid("A-z_0.9"));
	char longest[251];
	memset(longest, 'x', 250);
	longest[250] = '\0';
	assert_false(kafka_topic_valid(longest));
	longest[249] = '\0';
	assert_true(kafka_topic_valid(longest));
	assert_false(kafka_topic_valid(NULL));
}

static void test_invalid_row(void **unused)
{
	struct config cfg = cfg_base();
	struct outbox_event ev = event_base();
	struct kafka_msg m;
	enum pub_outcome fail = PUB_ACKED;
	char reason[256] = "";

	(void)unused;
	ev.type = "";
	assert_int_equal(
	    kafka_msg_build(&cfg, &ev, &m, &fail, reason, sizeof(reason)), -1);
	assert_int_equal(fail, PUB_PERMANENT);
	assert_true(reason[0] != '\0');

	ev = event_base();
	ev.headers_json = "{\"ce_id\":\"spoofed\"}";
	fail = PUB_ACKED;
	assert_int_equal(
	    kafka_msg_build(&cfg, &ev, &m, &fail, reason, sizeof(reason)), -1);
	assert_int_equal(fail, PUB_PERMANENT);
	assert_null(m.headers);
}

/* Memory running out inside cJSON at each of its allocations in turn
 * (encode_test.h), in both modes: the record is built, or the row is a
 * charged retry (PUB_EVENT), never failed at once as a bad row nor
 * released uncharged to come back at once. */
static void test_out_of_memory_is_a_retry(void **unused)
{
	struct outbox_event ev = event_base();
	int retried = 0;

	(void)unused;
	for (int mode = 0; mode < 2; mode++) {
		struct config cfg = cfg_base();
		cfg.ce_mode = mode ? CE_MODE_STRUCTURED : CE_MODE_BINARY;
		for (int after = 0; after < 48; after++) {
			struct kafka_msg m;
			enum pub_outcome fail = PUB_ACKED;
			char reason[256] = "";

			encode_test_json_fail(after, 1000);
			int rc = kafka_msg_build(&cfg, &ev, &m, &fail, reason,
						 sizeof(reason));
			encode_test_json_fail(0, 0);
			if (rc == 0) {
				kafka_msg_release(&m);
				continue;
			}
			assert_int_equal(fail, PUB_EVENT);
			assert_string_equal(reason, "out of memory");
			retried++;
		}
	}
	assert_true(retried >= 4);
}

struct outcome_case {
	rd_kafka_resp_err_t err;
	rd_kafka_msg_status_t status;
	enum pub_outcome want;
};

static void test_delivery_outcomes(void **unused)
{
	const rd_kafka_msg_status_t NP = RD_KAFKA_MSG_STATUS_NOT_PERSISTED;
	const rd_kafka_msg_status_t PP = RD_KAFKA_MSG_STATUS_POSSIBLY_PERSISTED;
	const struct outcome_case cases[] = {
	    {RD_KAFKA_RESP_ERR_NO_ERROR, RD_KAFKA_MSG_STATUS_PERSISTED,
	     PUB_ACKED},
	    /* the record itself */
	    {RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, NP, PUB_PERMANENT},
	    {RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, PP, PUB_PERMANENT},
	    {RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE, NP, PUB_PERMANENT},
	    {RD_KAFKA_RESP_ERR_INVALID_RECORD, NP, PUB_PERMANENT},
	    {RD_KAFKA_RESP_ERR_INVALID_MSG, NP, PUB_PERMANENT},
	    {RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE, NP, PUB_PERMANENT},
	    /* the topic */
	    {RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, NP, PUB_DESTINATION},
	    {RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC, NP, PUB_DESTINATION},
	    {RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION, NP, PUB_DESTINATION},
	    {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, NP, PUB_DESTINATION},
	    {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, PP, PUB_DESTINATION},
	    {RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION, NP, PUB_DESTINATION},
	    {RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT, NP,
	     PUB_DESTINATION},
	    /* the broker refused this record */
	    {RD_KAFKA_RESP_ERR_POLICY_VIOLATION, NP, PUB_EVENT},
	    {RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP, NP, PUB_EVENT},
	    /* the cluster: released only when surely not written */
	    {RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, NP, PUB_NOT_WRITTEN},
	    {RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, PP, PUB_TRANSPORT},
	    {RD_KAFKA_RESP_ERR__TIMED_OUT, PP, PUB_TRANSPORT},
	    {RD_KAFKA_RESP_ERR__TRANSPORT, PP, PUB_TRANSPORT},
	    {RD_KAFKA_RESP_ERR__TRANSPORT, NP, PUB_NOT_WRITTEN},
	    {RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS, NP, PUB_NOT_WRITTEN},
	    {RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND, PP,
	     PUB_TRANSPORT},
	    {RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, PP, PUB_TRANSPORT},
	    {RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, NP, PUB_NOT_WRITTEN},
	    {RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE, PP, PUB_TRANSPORT},
	    {RD_KAFKA_RESP_ERR__PURGE_QUEUE, NP, PUB_NOT_WRITTEN},
	    {RD_KAFKA_RESP_ERR__PURGE_QUEUE, PP, PUB_TRANSPORT},
	    {RD_KAFKA_RESP_ERR__PURGE_INFLIGHT, PP, PUB_TRANSPORT},
	    {RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED, NP,
	     PUB_NOT_WRITTEN},
	    {RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, PP, PUB_TRANSPORT},
	    {(rd_kafka_resp_err_t)12345, PP, PUB_TRANSPORT},
	    /* a dead producer: the charge is kept whatever the status */
	    {RD_KAFKA_RESP_ERR__FATAL, NP, PUB_TRANSPORT},
	    {RD_KAFKA_RESP_ERR__FATAL, PP, PUB_TRANSPORT},
	};

	(void)unused;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		enum pub_outcome got =
		    kafka_delivery_outcome(cases[i].err, cases[i].status);
		if (got != cases[i].want)
			fail_msg("%s status %d: got %d, want %d",
				 rd_kafka_err2name(cases[i].err),
				 (int)cases[i].status, (int)got,
				 (int)cases[i].want);
	}
}

static void test_produce_outcomes(void **unused)
{
	(void)unused;
	assert_int_equal(kafka_produce_outcome(RD_KAFKA_RESP_ERR_NO_ERROR),
			 PUB_ACKED);
	assert_int_equal(
	    kafka_produce_outcome(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE),
	    PUB_PERMANENT);
	assert_int_equal(
	    kafka_produce_outcome(RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC),
	    PUB_DESTINATION);
	assert_int_equal(
	    kafka_produce_outcome(RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION),
	    PUB_DESTINATION);
	assert_int_equal(kafka_produce_outcome(RD_KAFKA_RESP_ERR__QUEUE_FULL),
			 PUB_NOT_WRITTEN);
	assert_int_equal(kafka_produce_outcome(RD_KAFKA_RESP_ERR__FATAL),
			 PUB_NOT_WRITTEN);
	assert_int_equal(kafka_produce_outcome(RD_KAFKA_RESP_ERR__INVALID_ARG),
			 PUB_EVENT);
}

static void test_reason_text(void **unused)
{
	char buf[256];

	(void)unused;
	kafka_reason(buf, sizeof(buf), "delivery to topic 'x' failed",
		     RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
	assert_non_null(strstr(buf, "delivery to topic 'x' failed: "));
	assert_non_null(strstr(buf, "(MSG_SIZE_TOO_LARGE)"));
	kafka_reason(buf, sizeof(buf), "bad\nbyte\xff",
		     RD_KAFKA_RESP_ERR__TRANSPORT);
	assert_non_null(strstr(buf, "bad?byte?: "));
	kafka_reason(buf, 8, "truncated", RD_KAFKA_RESP_ERR__TRANSPORT);
	assert_string_equal(buf, "truncat");
}

/* ---- OUTBOX_KAFKA_* at startup ---- */

static int validate_with(struct kafka_prop *props, size_t n, char *err,
			 size_t errlen)
{
	struct config cfg = cfg_base();

	settings.props = props;
	settings.n_props = n;
	err[0] = '\0';
	return publisher_kafka.validate(&cfg, err, errlen);
}

static void test_validate_properties(void **unused)
{
	char err[1024];
	struct kafka_prop good[] = {
	    {(char *)"compression.type", (char *)"lz4", false},
	    {(char *)"linger.ms", (char *)"20", false},
	    {(char *)"partitioner", (char *)"murmur2_random", false},
	    {(char *)"sasl.password", (char *)"hunter2", true},
	};
	struct kafka_prop unknown[] = {
	    {(char *)"no.such.thing", (char *)"1", false},
	};
	struct kafka_prop invalid[] = {
	    {(char *)"compression.type", (char *)"rot13", false},
	};
	struct kafka_prop secret_invalid[] = {
	    {(char *)"enable.sasl.oauthbearer.unsecure.jwt",
	     (char *)"sekrit-value", true},
	};
	struct kafka_prop only_errors[] = {
	    {(char *)"delivery.report.only.error", (char *)"true", false},
	};
	struct kafka_prop transactional[] = {
	    {(char *)"transactional.id", (char *)"relay-1", false},
	};
	/* Each property is fine alone; together they contradict
	 * idempotence, which only rd_kafka_new() notices. */
	struct kafka_prop contradiction[] = {
	    {(char *)"max.in.flight.requests.per.connection", (char *)"10",
	     false},
	};

	(void)unused;
	assert_int_equal(validate_with(good, 4, err, sizeof(err)), 0);
	assert_int_equal(validate_with(NULL, 0, err, sizeof(err)), 0);

	assert_int_equal(validate_with(unknown, 1, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "OUTBOX_KAFKA_NO_SUCH_THING"));
	assert_non_null(strstr(err, "no.such.thing"));

	assert_int_equal(validate_with(invalid, 1, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "OUTBOX_KAFKA_COMPRESSION_TYPE"));

	assert_int_equal(validate_with(secret_invalid, 1, err, sizeof(err)),
			 -1);
	assert_non_null(
	    strstr(err, "OUTBOX_KAFKA_ENABLE_SASL_OAUTHBEARER_UNSECURE_JWT"));
	assert_null(strstr(err, "sekrit"));

	assert_int_equal(validate_with(only_errors, 1, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "OUTBOX_KAFKA_DELIVERY_REPORT_ONLY_ERROR"));

	assert_int_equal(validate_with(transactional, 1, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "OUTBOX_KAFKA_TRANSACTIONAL_ID"));

	assert_int_equal(validate_with(contradiction, 1, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "OUTBOX_KAFKA_"));
	assert_non_null(strstr(err, "max.in.flight"));
}

static void test_registry(void **unused)
{
	(void)unused;
	assert_ptr_equal(publisher_find("kafka"), &publisher_kafka);
	assert_non_null(publisher_kafka.service);
	assert_string_equal(publisher_kafka.name, "kafka");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_binary_mode),
	    cmocka_unit_test(test_binary_optional_attributes),
	    cmocka_unit_test(test_key_from_routing_key),
	    cmocka_unit_test(test_structured_mode),
	    cmocka_unit_test(test_topic_choice),
	    cmocka_unit_test(test_invalid_row),
	    cmocka_unit_test(test_out_of_memory_is_a_retry),
	    cmocka_unit_test(test_delivery_outcomes),
	    cmocka_unit_test(test_produce_outcomes),
	    cmocka_unit_test(test_reason_text),
	    cmocka_unit_test(test_validate_properties),
	    cmocka_unit_test(test_registry),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
