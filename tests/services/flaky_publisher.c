/* SPDX-License-Identifier: MIT */
/*
 * A test backend linked only into the test program outbox-relay-flaky
 * (the production binary does not have it): it "delivers" events by
 * appending one JSON line per acknowledged event to a shared file opened
 * with O_APPEND, so the lines of several relay processes land in one
 * global delivery order, and it fails a share of publishes retryably.
 *
 *   OUTBOX_PUBLISHER=flaky
 *   RELAY_TEST_FLAKY_FILE     the delivery log (required)
 *   RELAY_TEST_FLAKY_PERCENT  share of events nacked (PUB_EVENT), 0-100
 *   RELAY_TEST_FLAKY_DELAY_MS pause before each event, to widen windows
 *   RELAY_TEST_FLAKY_ACK_DELAY_MS pause after each event is delivered,
 *                             before it is acknowledged: a broker slow to
 *                             confirm what it already has
 *   RELAY_TEST_FLAKY_DEADLINE 1: an event not acknowledged by the
 *                             publish's deadline (ctx->deadline_ms, read at
 *                             each event) is in doubt (PUB_TRANSPORT), as a
 *                             broker's confirm that came too late
 *   RELAY_TEST_FLAKY_SHUFFLE  1: each batch is delivered and acknowledged
 *                             in a random order, as a broker confirming
 *                             out of order would
 *   RELAY_TEST_FLAKY_REFUSE   a path: while a file is there, every
 *                             event's destination refuses it
 *                             (PUB_DESTINATION, which pauses the
 *                             destination), as a broker's missing queue
 *   RELAY_TEST_FLAKY_JSON_OOM N: once the publisher opened, cJSON's next N
 *                             allocations in the process fail
 *                             (encode_test.h): the worker's check of a
 *                             row's headers meets no memory
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "encode/encode_test.h"
#include "publishers/publisher.h"

struct flaky {
	int fd;
	int percent;
	int delay_ms;
	int ack_delay_ms;
	int shuffle;
	int deadline;
	const char *refuse; /* RELAY_TEST_FLAKY_REFUSE, NULL: none */
	unsigned int seed;
};

static int flaky_validate(const struct config *cfg, char *err, size_t errlen)
{
	(void)cfg;
	if (!getenv("RELAY_TEST_FLAKY_FILE")) {
		snprintf(err, errlen, "RELAY_TEST_FLAKY_FILE is not set");
		return -1;
	}
	return 0;
}

static int flaky_open(const struct config *cfg, void **state, char *err,
		      size_t errlen)
{
	(void)cfg;
	struct flaky *f = calloc(1, sizeof(*f));
	const char *path = getenv("RELAY_TEST_FLAKY_FILE");
	if (!f || !path) {
		free(f);
		snprintf(err, errlen, "flaky: no memory or no file");
		return -1;
	}
	f->fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (f->fd < 0) {
		snprintf(err, errlen, "flaky: cannot open %s", path);
		free(f);
		return -1;
	}
	const char *p = getenv("RELAY_TEST_FLAKY_PERCENT");
	const char *d = getenv("RELAY_TEST_FLAKY_DELAY_MS");
	const char *sh = getenv("RELAY_TEST_FLAKY_SHUFFLE");
	f->percent = p ? atoi(p) : 0;
	f->delay_ms = d ? atoi(d) : 0;
	d = getenv("RELAY_TEST_FLAKY_ACK_DELAY_MS");
	f->ack_delay_ms = d ? atoi(d) : 0;
	f->shuffle = sh ? atoi(sh) : 0;
	d = getenv("RELAY_TEST_FLAKY_DEADLINE");
	f->deadline = d ? atoi(d) : 0;
	f->refuse = getenv("RELAY_TEST_FLAKY_REFUSE");
	const char *oom = getenv("RELAY_TEST_FLAKY_JSON_OOM");
	if (oom)
		encode_test_json_fail(0, atoi(oom));
	f->seed = (unsigned int)(getpid() ^ time(NULL));
	*state = f;
	return 0;
}

static int flaky_publish(void *state, const struct outbox_event *events,
			 size_t n, struct publish_ctx *ctx,
			 struct pub_result *results)
{
	struct flaky *f = state;
	size_t *order = malloc((n ? n : 1) * sizeof(*order));
	if (!order)
		return -1; /* every row stays "no outcome": in doubt */
	for (size_t k = 0; k < n; k++)
		order[k] = k;
	for (size_t k = n; f->shuffle && k > 1; k--) {
		size_t j = (size_t)rand_r(&f->seed) % k, t = order[k - 1];
		order[k - 1] = order[j];
		order[j] = t;
	}
	for (size_t k = 0; k < n; k++) {
		size_t i = order[k];
		struct pub_result *r = &results[i];
		r->route_scoped = false;
		r->reason[0] = '\0';
		clock_sleep_ms(f->delay_ms);
		ctx->tick(ctx);
		/* Asked after the pause: a relay stopped there must not
		 * write once its lease deadline has passed. */
		if (!ctx->may_send(ctx, i)) {
			r->outcome = PUB_NOT_WRITTEN;
			snprintf(r->reason, sizeof(r->reason), "not sent");
			continue;
		}
		if (f->refuse && access(f->refuse, F_OK) == 0) {
			r->outcome = PUB_DESTINATION;
			snprintf(r->reason, sizeof(r->reason),
				 "flaky: destination refuses");
			continue;
		}
		if ((int)(rand_r(&f->seed) % 100) < f->percent) {
			r->outcome = PUB_EVENT;
			snprintf(r->reason, sizeof(r->reason),
				 "flaky: injected nack");
			continue;
		}
		char line[512];
		int len = snprintf(
		    line, sizeof(line),
		    "{\"id\":\"%s\",\"key\":\"%s\",\"seq\":%lld,"
		    "\"pid\":%d}\n",
		    events[i].id,
		    events[i].partition_key ? events[i].partition_key : "",
		    (long long)events[i].seq, (int)getpid());
		if (write(f->fd, line, (size_t)len) != len) {
			r->outcome = PUB_TRANSPORT;
			snprintf(r->reason, sizeof(r->reason), "flaky: write");
			continue;
		}
		if (f->ack_delay_ms > 0) {
			clock_sleep_ms(f->ack_delay_ms);
			ctx->tick(ctx);
		}
		if (f->deadline && clock_ms() >= ctx->deadline_ms) {
			r->outcome = PUB_TRANSPORT;
			snprintf(r->reason, sizeof(r->reason),
				 "flaky: no confirm by the deadline");
			continue;
		}
		r->outcome = PUB_ACKED;
	}
	free(order);
	return 0;
}

static int flaky_probe(void *state, char *err, size_t errlen)
{
	(void)state;
	(void)err;
	(void)errlen;
	return 0;
}

static void flaky_close(void *state)
{
	struct flaky *f = state;
	close(f->fd);
	free(f);
}

static const struct publisher_ops publisher_flaky = {
    .name = "flaky",
    .validate = flaky_validate,
    .open = flaky_open,
    .publish = flaky_publish,
    .probe = flaky_probe,
    .close = flaky_close,
};

const struct publisher_ops *const publisher_test_registry[] = {
    &publisher_flaky,
    NULL,
};
