/* SPDX-License-Identifier: MIT */
/*
 * The stdout backend: one structured-mode CloudEvent JSON per line, for
 * development and demos. OUTBOX_CE_MODE does not apply; destinations
 * (exchange, routing key) are ignored. An event counts as acknowledged
 * once the line is flushed to the descriptor.
 *
 * Threading: as publisher.h says, one lane at a time per state; but every
 * worker's state writes to the process's one stdout FILE, the only thing
 * backends share between states. A batch (and a probe) holds the FILE's
 * lock from its first write to its flush: between a worker's fwrite() and
 * its fflush(), another worker's failed write must not purge the first
 * one's buffered lines (nor clear its error flag), or the first would
 * report as flushed lines that never reached the descriptor.
 */
#include "backends.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdio_ext.h>
#include <stdlib.h>
#include <string.h>

#include "encode/encode.h"

struct stdout_state {
	FILE *out; /* stdout; borrowed, never closed here */
	/* A failed write may have left part of a line on the descriptor;
	 * the next batch starts on a new line so no event shares it. */
	bool torn;
};

static void set_outcome(struct pub_result *r, enum pub_outcome outcome,
			const char *reason)
{
	r->outcome = outcome;
	r->route_scoped = false;
	snprintf(r->reason, sizeof(r->reason), "%s", reason);
}

static void describe_errno(char *buf, size_t buflen, const char *what, int e)
{
	char tmp[128];

	snprintf(buf, buflen, "%s: %s", what,
		 e ? strerror_r(e, tmp, sizeof(tmp)) : "stream error");
}

/* After a failed write nothing buffered may reach the descriptor later
 * glued to the next batch's lines. */
static void stdout_discard(struct stdout_state *st)
{
	__fpurge(st->out);
	clearerr(st->out);
	st->torn = true;
}

static int stdout_validate(const struct config *cfg, char *err, size_t errlen)
{
	(void)cfg;
	(void)err;
	(void)errlen;
	return 0;
}

static int stdout_open(const struct config *cfg, void **state, char *err,
		       size_t errlen)
{
	struct stdout_state *st = calloc(1, sizeof(*st));

	(void)cfg;
	if (!st) {
		snprintf(err, errlen, "stdout publisher: out of memory");
		return -1;
	}
	st->out = stdout;
	*state = st;
	return 0;
}

static int stdout_publish(void *state, const struct outbox_event *events,
			  size_t n, struct publish_ctx *ctx,
			  struct pub_result *results)
{
	struct stdout_state *st = state;
	int write_errno = 0;
	bool failed = false;
	int rc = 0;

	flockfile(st->out);
	clearerr(st->out);
	if (st->torn && fputc('\n', st->out) == EOF) {
		write_errno = errno;
		failed = true;
	}
	for (size_t i = 0; i < n; i++) {
		struct pub_result *r = &results[i];
		char *line;
		size_t len;

		if (failed ||
		    (ctx && ctx->may_send && !ctx->may_send(ctx, i))) {
			set_outcome(r, PUB_NOT_WRITTEN,
				    "not handed to the broker");
			continue;
		}
		if (cloudevent_validate(&events[i], r->reason,
					sizeof(r->reason)) != 0) {
			/* Memory: retried with backoff (worker.c,
			 * validate_rows). */
			r->outcome =
			    strcmp(r->reason, CLOUDEVENT_NO_MEMORY) == 0
				? PUB_EVENT
				: PUB_PERMANENT;
			r->route_scoped = false;
			continue;
		}
		line = cloudevent_structured(&events[i], &len, r->reason,
					     sizeof(r->reason));
		if (!line) {
			/* Valid row, so memory ran out: nothing written,
			 * retried with backoff. */
			r->outcome = PUB_EVENT;
			r->route_scoped = false;
			continue;
		}
		line[len] = '\n';
		/* One fwrite per line: a line is never split between two
		 * calls that another writer could get between. */
		if (fwrite(line, 1, len + 1, st->out) != len + 1) {
			write_errno = errno;
			failed = true;
		}
		free(line);
		/* Provisional: becomes PUB_TRANSPORT if the flush fails. */
		set_outcome(r, PUB_ACKED, "");
	}
	if (!failed && (fflush(st->out) != 0 || ferror(st->out))) {
		write_errno = errno;
		failed = true;
	}
	if (!failed) {
		st->torn = false;
		goto out;
	}
	/* Everything written since the last successful flush is in doubt:
	 * some of it may have reached the descriptor. */
	for (size_t i = 0; i < n; i++) {
		if (results[i].outcome != PUB_ACKED)
			continue;
		results[i].outcome = PUB_TRANSPORT;
		describe_errno(results[i].reason, sizeof(results[i].reason),
			       "writing to stdout failed", write_errno);
	}
	stdout_discard(st);
	rc = -1;
out:
	funlockfile(st->out);
	return rc;
}

static int stdout_probe(void *state, char *err, size_t errlen)
{
	struct stdout_state *st = state;
	int fd, flags, rc = -1;

	flockfile(st->out);
	clearerr(st->out);
	fd = fileno(st->out);
	if (fd < 0) {
		snprintf(err, errlen, "stdout has no file descriptor");
		goto out;
	}
	flags = fcntl(fd, F_GETFL);
	if (flags < 0) {
		describe_errno(err, errlen, "stdout is not open", errno);
		goto out;
	}
	if ((flags & O_ACCMODE) == O_RDONLY) {
		snprintf(err, errlen, "stdout is not open for writing");
		goto out;
	}
	if (fflush(st->out) != 0 || ferror(st->out)) {
		describe_errno(err, errlen, "flushing stdout failed", errno);
		stdout_discard(st);
		goto out;
	}
	rc = 0;
out:
	funlockfile(st->out);
	return rc;
}

static void stdout_close(void *state)
{
	struct stdout_state *st = state;

	if (!st)
		return;
	fflush(st->out);
	free(st);
}

const struct publisher_ops publisher_stdout = {
    .name = "stdout",
    .validate = stdout_validate,
    .open = stdout_open,
    .publish = stdout_publish,
    .probe = stdout_probe,
    .service = NULL,
    .close = stdout_close,
};
