/* SPDX-License-Identifier: MIT */
/*
 * What the operator commands show while they work: a progress line for
 * long commands (redrive, migrate's index builds) and the live view of
 * `status --watch`. Private to src/ops/.
 */
#ifndef OUTBOX_OPS_PROGRESS_H
#define OUTBOX_OPS_PROGRESS_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "store/store.h"

/*
 * A progress line redrawn in place on stderr, at most five times a
 * second; silent when stderr is not a terminal or with --quiet. stop (may
 * be NULL) is the flag a SIGINT handler sets: the watcher then asks the
 * command to stop at its next safe point.
 */
struct cli_progress {
	struct store_progress watcher; /* hand this to the store */
	const char *command;	       /* "redrive", "migrate" */
	bool on;
	bool drawn; /* a line is on the screen */
	int64_t started_ms, last_ms;
	volatile sig_atomic_t *stop;
};

void cli_progress_init(struct cli_progress *p, const char *command, bool quiet,
		       volatile sig_atomic_t *stop);

/* Ends the line on the screen, if any, so what follows starts clean. */
void cli_progress_end(struct cli_progress *p);

/*
 * Set by SIGINT and SIGTERM once cli_catch_interrupts() ran: `status
 * --watch` and `redrive` then stop at their next safe point instead of
 * dying mid-way. Written by the handler only, read by the one thread.
 */
extern volatile sig_atomic_t cli_interrupted;
void cli_catch_interrupts(void);

/* "2s", "500ms", "1m", "1h", or a bare number of seconds, into *ms. */
bool cli_parse_interval(const char *text, int64_t *ms);

/* "45s", "2m03s", "1h02m", "3d04h" into out. */
void cli_format_duration(double seconds, char *out, size_t outlen);

/*
 * `status --watch`: redraws what store_admin_watch() reads every
 * interval_ms until *stop, in place on a terminal (tty) or as one plain
 * line per interval otherwise. A failed read is shown and retried next
 * interval (reconnecting when the session is gone). Returns 0 once
 * stopped, or 1 if writing to out failed.
 */
int status_watch(struct store *s, const char *table, int64_t interval_ms,
		 FILE *out, bool tty, volatile sig_atomic_t *stop);

#endif
