/* SPDX-License-Identifier: MIT */
/* Unit tests for the stdout publisher and the backend registry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <cmocka.h>

#include <cJSON.h>

#include "encode/encode_test.h"
#include "publishers/amqp_map.h"
#include "publishers/backends.h"
#include "publishers/kafka.h"
#include "publishers/publisher.h"

#define NEV 4

static const char *const ids[NEV] = {
    "0190a1b2-0000-7000-8000-000000000001",
    "0190a1b2-0000-7000-8000-000000000002",
    "0190a1b2-0000-7000-8000-000000000003",
    "0190a1b2-0000-7000-8000-000000000004",
};

static const unsigned char body[] = {'{', '"', 'n', '"', ':', '1', '}'};

static void events_init(struct outbox_event *ev, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		ev[i] = (struct outbox_event){
		    .id = ids[i],
		    .seq = (int64_t)i + 1,
		    .type = "com.example.test.v1",
		    .source = "urn:test",
		    .content_type = "application/json",
		    .routing_key = "",
		    .payload = body,
		    .payload_len = sizeof(body),
		    .headers_json = "{}",
		    .time = "2024-05-01T00:00:00.000000Z",
		    .attempts = 1,
		    .max_attempts = 10,
		};
	}
}

/* fd 1 pointed somewhere else for the length of one publisher call; the
 * assertions run only after it is restored, so cmocka's own output never
 * lands in the capture. */
struct capture {
	FILE *file; /* NULL when fd 1 points at a caller-given descriptor */
	int saved;
};

static void redirect_fd(struct capture *c, int fd)
{
	fflush(stdout);
	c->saved = dup(STDOUT_FILENO);
	assert_true(c->saved >= 0);
	assert_true(dup2(fd, STDOUT_FILENO) >= 0);
}

static void capture_start(struct capture *c)
{
	c->file = tmpfile();
	assert_non_null(c->file);
	redirect_fd(c, fileno(c->file));
}

/* Restores fd 1; returns what was written (malloc'd, NUL-terminated), or
 * NULL when the capture had no file. */
static char *capture_end(struct capture *c)
{
	char *text = NULL;
	long size;

	assert_true(dup2(c->saved, STDOUT_FILENO) >= 0);
	close(c->saved);
	if (!c->file)
		return NULL;
	assert_int_equal(fseek(c->file, 0, SEEK_END), 0);
	size = ftell(c->file);
	assert_true(size >= 0);
	rewind(c->file);
	text = malloc((size_t)size + 1);
	assert_non_null(text);
	assert_int_equal(fread(text, 1, (size_t)size, c->file), (size_t)size);
	text[size] = '\0';
	fclose(c->file);
	c->file = NULL;
	return text;
}

/* may_send answers from a table and records the order of the questions. */
struct gate {
	bool allow[NEV];
	size_t asked[NEV];
	size_t n_asked;
};

static bool gate_may_send(struct publish_ctx *ctx, size_t i)
{
	struct gate *g = ctx->opaque;

	if (g->n_asked < NEV)
		g->asked[g->n_asked] = i;
	g->n_asked++;
	return g->allow[i];
}

static bool gate_tick(struct publish_ctx *ctx)
{
	(void)ctx;
	return false;
}

struct run {
	struct gate gate;
	struct publish_ctx ctx;
	struct pub_result results[NEV];
	void *state;
};

static void run_init(struct run *r)
{
	char err[256] = "";

	memset(r, 0, sizeof(*r));
	for (size_t i = 0; i < NEV; i++)
		r->gate.allow[i] = true;
	r->ctx.deadline_ms = INT64_MAX;
	r->ctx.may_send = gate_may_send;
	r->ctx.tick = gate_tick;
	r->ctx.opaque = &r->gate;
	assert_int_equal(
	    publisher_stdout.open(NULL, &r->state, err, sizeof(err)), 0);
	assert_non_null(r->state);
}

/* Splits text into lines (modifies it); returns the count. */
static size_t split_lines(char *text, char **lines, size_t max)
{
	size_t n = 0;
	char *p = text;

	while (*p) {
		char *nl = strchr(p, '\n');

		assert_non_null(nl); /* every line is complete */
		*nl = '\0';
		assert_true(n < max);
		lines[n++] = p;
		p = nl + 1;
	}
	return n;
}

static void assert_line_is_event(const char *line, const char *id)
{
	cJSON *doc = cJSON_Parse(line);
	const cJSON *data;

	assert_non_null(doc);
	assert_string_equal(
	    cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(doc, "id")),
	    id);
	assert_string_equal(
	    cJSON_GetStringValue(
		cJSON_GetObjectItemCaseSensitive(doc, "specversion")),
	    "1.0");
	data = cJSON_GetObjectItemCaseSensitive(doc, "data");
	assert_int_equal(cJSON_GetObjectItemCaseSensitive(data, "n")->valueint,
			 1);
	cJSON_Delete(doc);
}

static void test_publish_one_line_per_event(void **state)
{
	struct outbox_event ev[NEV];
	struct capture cap;
	struct run r;
	char *lines[NEV + 1];
	char *text;
	int rc;

	(void)state;
	events_init(ev, NEV);
	run_init(&r);
	capture_start(&cap);
	rc = publisher_stdout.publish(r.state, ev, NEV, &r.ctx, r.results);
	text = capture_end(&cap);

	assert_int_equal(rc, 0);
	assert_int_equal(split_lines(text, lines, NEV + 1), NEV);
	for (size_t i = 0; i < NEV; i++) {
		assert_int_equal(r.results[i].outcome, PUB_ACKED);
		assert_string_equal(r.results[i].reason, "");
		assert_line_is_event(lines[i], ids[i]);
	}
	assert_int_equal(r.gate.n_asked, NEV);
	for (size_t i = 0; i < NEV; i++)
		assert_int_equal(r.gate.asked[i], i);
	free(text);
	publisher_stdout.close(r.state);
}

static void test_publish_bad_event_permanent(void **state)
{
	struct outbox_event ev[NEV];
	struct capture cap;
	struct run r;
	char *lines[NEV + 1];
	char *text;
	int rc;

	(void)state;
	events_init(ev, NEV);
	ev[1].headers_json = "{\"ce-id\":\"spoof\"}";
	ev[3].type = "";
	run_init(&r);
	capture_start(&cap);
	rc = publisher_stdout.publish(r.state, ev, NEV, &r.ctx, r.results);
	text = capture_end(&cap);

	assert_int_equal(rc, 0);
	assert_int_equal(r.results[0].outcome, PUB_ACKED);
	assert_int_equal(r.results[1].outcome, PUB_PERMANENT);
	assert_string_equal(r.results[1].reason,
			    "header \"ce-id\" collides with a CloudEvents "
			    "attribute");
	assert_int_equal(r.results[2].outcome, PUB_ACKED);
	assert_int_equal(r.results[3].outcome, PUB_PERMANENT);
	assert_string_equal(r.results[3].reason, "empty type");
	assert_int_equal(split_lines(text, lines, NEV + 1), 2);
	assert_line_is_event(lines[0], ids[0]);
	assert_line_is_event(lines[1], ids[2]);
	free(text);
	publisher_stdout.close(r.state);
}

/* Memory running out inside cJSON at each of its allocations in turn
 * (encode_test.h): the event is written, or retried with backoff (a
 * charged attempt, so that a row that always needs more memory than there
 * is ends at max_attempts), never failed at once as a bad row. */
static void test_publish_out_of_memory_not_permanent(void **state)
{
	struct outbox_event ev[1];
	int unwritten = 0;

	(void)state;
	events_init(ev, 1);
	ev[0].headers_json = "{\"x-tenant\":\"t1\"}";
	for (int after = 0; after < 32; after++) {
		struct capture cap;
		struct run r;

		run_init(&r);
		capture_start(&cap);
		encode_test_json_fail(after, 1000);
		int rc =
		    publisher_stdout.publish(r.state, ev, 1, &r.ctx, r.results);
		encode_test_json_fail(0, 0);
		char *text = capture_end(&cap);
		assert_int_equal(rc, 0);
		if (r.results[0].outcome == PUB_ACKED) {
			assert_line_is_event(strtok(text, "\n"), ids[0]);
		} else {
			assert_int_equal(r.results[0].outcome, PUB_EVENT);
			assert_string_equal(r.results[0].reason,
					    CLOUDEVENT_NO_MEMORY);
			assert_string_equal(text, "");
			unwritten++;
		}
		free(text);
		publisher_stdout.close(r.state);
	}
	assert_true(unwritten >= 2);
}

static void test_publish_may_send_false(void **state)
{
	struct outbox_event ev[NEV];
	struct capture cap;
	struct run r;
	char *lines[NEV + 1];
	char *text;
	int rc;

	(void)state;
	events_init(ev, NEV);
	/* Asked before validation: an unsendable bad row is released, not
	 * failed. */
	ev[2].type = "";
	run_init(&r);
	r.gate.allow[1] = false;
	r.gate.allow[2] = false;
	capture_start(&cap);
	rc = publisher_stdout.publish(r.state, ev, NEV, &r.ctx, r.results);
	text = capture_end(&cap);

	assert_int_equal(rc, 0);
	assert_int_equal(r.results[0].outcome, PUB_ACKED);
	assert_int_equal(r.results[1].outcome, PUB_NOT_WRITTEN);
	assert_string_equal(r.results[1].reason, "not handed to the broker");
	assert_int_equal(r.results[2].outcome, PUB_NOT_WRITTEN);
	assert_int_equal(r.results[3].outcome, PUB_ACKED);
	assert_int_equal(split_lines(text, lines, NEV + 1), 2);
	assert_line_is_event(lines[0], ids[0]);
	assert_line_is_event(lines[1], ids[3]);
	assert_null(strstr(text, ids[1]));
	assert_null(strstr(lines[1], ids[2]));
	free(text);
	publisher_stdout.close(r.state);
}

/* While a batch is being written, may another thread take stdout? Asked
 * from the publisher's own may_send callback, between two lines. */
struct lock_probe {
	int free_mid_batch; /* ftrylockfile() from another thread succeeded */
	size_t asked;
};

static void *try_stdout(void *arg)
{
	struct lock_probe *p = arg;
	if (ftrylockfile(stdout) == 0) {
		p->free_mid_batch++;
		funlockfile(stdout);
	}
	return NULL;
}

static bool probe_may_send(struct publish_ctx *ctx, size_t i)
{
	struct lock_probe *p = ctx->opaque;
	pthread_t t;
	p->asked++;
	if (i > 0 && pthread_create(&t, NULL, try_stdout, p) == 0)
		pthread_join(t, NULL);
	return true;
}

static bool probe_tick(struct publish_ctx *ctx)
{
	(void)ctx;
	return false;
}

/* Every worker's state writes to the one stdout FILE: a batch holds its
 * lock from its first line to its flush, so another worker's failed
 * write cannot purge this batch's buffered lines between its fwrite()
 * and its fflush() (which would then report them written). */
static void test_publish_holds_stdout_for_the_batch(void **state)
{
	struct outbox_event ev[NEV];
	struct pub_result results[NEV];
	struct lock_probe probe = {0};
	struct publish_ctx ctx = {.deadline_ms = INT64_MAX,
				  .may_send = probe_may_send,
				  .tick = probe_tick,
				  .opaque = &probe};
	struct capture cap;
	void *st = NULL;
	char err[128];

	(void)state;
	events_init(ev, NEV);
	assert_int_equal(publisher_stdout.open(NULL, &st, err, sizeof(err)), 0);
	capture_start(&cap);
	int rc = publisher_stdout.publish(st, ev, NEV, &ctx, results);
	free(capture_end(&cap));
	publisher_stdout.close(st);
	assert_int_equal(rc, 0);
	assert_int_equal(probe.asked, NEV);
	assert_int_equal(probe.free_mid_batch, 0);
}

static int open_dev_full(void)
{
	int fd = open("/dev/full", O_WRONLY);

	if (fd < 0)
		skip();
	return fd;
}

static void test_publish_write_error_transport(void **state)
{
	struct outbox_event ev[NEV];
	struct capture cap = {0};
	struct run r;
	char err[256] = "";
	char *lines[NEV + 1];
	char *text;
	int fd = open_dev_full();
	int rc;

	(void)state;
	events_init(ev, NEV);
	ev[0].type = "";
	run_init(&r);
	r.gate.allow[3] = false;
	redirect_fd(&cap, fd);
	rc = publisher_stdout.publish(r.state, ev, NEV, &r.ctx, r.results);
	capture_end(&cap);
	close(fd);

	assert_int_equal(rc, -1);
	/* Encoding failures are the row's, whatever happens to stdout. */
	assert_int_equal(r.results[0].outcome, PUB_PERMANENT);
	/* The first written line is in doubt; whether the second was written
	 * before the error showed depends on stdout's buffering mode, but it
	 * is never acknowledged. */
	assert_int_equal(r.results[1].outcome, PUB_TRANSPORT);
	assert_string_equal(r.results[1].reason,
			    "writing to stdout failed: No space left on "
			    "device");
	assert_true(r.results[2].outcome == PUB_TRANSPORT ||
		    r.results[2].outcome == PUB_NOT_WRITTEN);
	assert_int_equal(r.results[3].outcome, PUB_NOT_WRITTEN);

	/* Healthy again once stdout is; the next batch starts on a fresh
	 * line in case the failed one left part of a line behind. */
	capture_start(&cap);
	assert_int_equal(publisher_stdout.probe(r.state, err, sizeof(err)), 0);
	events_init(ev, NEV);
	rc = publisher_stdout.publish(r.state, ev, 1, &r.ctx, r.results);
	text = capture_end(&cap);
	assert_int_equal(rc, 0);
	assert_int_equal(r.results[0].outcome, PUB_ACKED);
	assert_int_equal(text[0], '\n');
	assert_int_equal(split_lines(text + 1, lines, NEV + 1), 1);
	assert_line_is_event(lines[0], ids[0]);
	free(text);
	publisher_stdout.close(r.state);
}

static void test_publish_large_write_error(void **state)
{
	static unsigned char big[100000];
	struct outbox_event ev[2];
	struct capture cap = {0};
	struct run r;
	int fd = open_dev_full();
	int rc;

	(void)state;
	events_init(ev, 2);
	ev[0].content_type = "application/octet-stream";
	ev[0].payload = big;
	ev[0].payload_len = sizeof(big);
	run_init(&r);
	redirect_fd(&cap, fd);
	rc = publisher_stdout.publish(r.state, ev, 2, &r.ctx, r.results);
	capture_end(&cap);
	close(fd);

	/* A line larger than any stdio buffer fails in its own fwrite: the
	 * rest of the batch is never handed over. */
	assert_int_equal(rc, -1);
	assert_int_equal(r.results[0].outcome, PUB_TRANSPORT);
	assert_int_equal(r.results[1].outcome, PUB_NOT_WRITTEN);
	assert_string_equal(r.results[1].reason, "not handed to the broker");
	assert_int_equal(r.gate.n_asked, 1);
	publisher_stdout.close(r.state);
}

static void test_probe(void **state)
{
	struct capture cap = {0};
	struct run r;
	char err[256] = "";
	int fd;
	int rc;

	(void)state;
	run_init(&r);

	capture_start(&cap);
	rc = publisher_stdout.probe(r.state, err, sizeof(err));
	free(capture_end(&cap));
	assert_int_equal(rc, 0);

	fd = open("/dev/null", O_RDONLY);
	assert_true(fd >= 0);
	redirect_fd(&cap, fd);
	rc = publisher_stdout.probe(r.state, err, sizeof(err));
	capture_end(&cap);
	close(fd);
	assert_int_equal(rc, -1);
	assert_string_equal(err, "stdout is not open for writing");

	fflush(stdout);
	cap.saved = dup(STDOUT_FILENO);
	assert_true(cap.saved >= 0);
	close(STDOUT_FILENO);
	rc = publisher_stdout.probe(r.state, err, sizeof(err));
	capture_end(&cap);
	assert_int_equal(rc, -1);
	assert_string_equal(err, "stdout is not open: Bad file descriptor");

	publisher_stdout.close(r.state);
}

static void test_validate_and_empty_batch(void **state)
{
	char err[256] = "";
	struct capture cap;
	struct run r;
	char *text;

	(void)state;
	assert_int_equal(publisher_stdout.validate(NULL, err, sizeof(err)), 0);
	run_init(&r);
	capture_start(&cap);
	assert_int_equal(
	    publisher_stdout.publish(r.state, NULL, 0, &r.ctx, r.results), 0);
	text = capture_end(&cap);
	assert_string_equal(text, "");
	free(text);
	publisher_stdout.close(r.state);
	publisher_stdout.close(NULL);
}

static void test_registry(void **state)
{
	size_t n = 0;

	(void)state;
	assert_ptr_equal(publisher_find("stdout"), &publisher_stdout);
	assert_null(publisher_find("STDOUT"));
	assert_null(publisher_find("nope"));
	assert_null(publisher_find(""));
	assert_null(publisher_find(NULL));
	for (size_t i = 0; publisher_registry[i]; i++, n++) {
		const struct publisher_ops *ops = publisher_registry[i];

		assert_non_null(ops->name);
		assert_non_null(ops->validate);
		assert_non_null(ops->open);
		assert_non_null(ops->publish);
		assert_non_null(ops->probe);
		assert_non_null(ops->close);
		assert_ptr_equal(publisher_find(ops->name), ops);
		for (size_t j = 0; j < i; j++)
			assert_string_not_equal(publisher_registry[j]->name,
						ops->name);
	}
	assert_true(n >= 1);
}

static void test_default_destination(void **state)
{
	char amqp[] = "amqp", kafka[] = "kafka", out[] = "stdout";
	char exchange[] = "events", topic[] = "outbox";
	struct rmq_settings as = {.exchange = exchange};
	struct kafka_settings ks = {.topic = topic};
	struct config cfg = {
	    .parts = {{&rmq_settings_group, &as}, {&kafka_settings_group, &ks}},
	    .n_parts = 2,
	};

	(void)state;
	cfg.publisher = amqp;
	assert_string_equal(publisher_default_destination(&cfg), "events");
	cfg.publisher = kafka;
	assert_string_equal(publisher_default_destination(&cfg), "outbox");
	cfg.publisher = out;
	assert_string_equal(publisher_default_destination(&cfg), "");
	cfg.publisher = NULL;
	assert_string_equal(publisher_default_destination(&cfg), "");
	cfg.publisher = amqp;
	as.exchange = NULL;
	assert_string_equal(publisher_default_destination(&cfg), "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_publish_one_line_per_event),
	    cmocka_unit_test(test_publish_bad_event_permanent),
	    cmocka_unit_test(test_publish_out_of_memory_not_permanent),
	    cmocka_unit_test(test_publish_may_send_false),
	    cmocka_unit_test(test_publish_holds_stdout_for_the_batch),
	    cmocka_unit_test(test_publish_write_error_transport),
	    cmocka_unit_test(test_publish_large_write_error),
	    cmocka_unit_test(test_probe),
	    cmocka_unit_test(test_validate_and_empty_batch),
	    cmocka_unit_test(test_registry),
	    cmocka_unit_test(test_default_destination),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
