/* SPDX-License-Identifier: MIT */
/* The progress line of long operator commands (progress.h). */
#include "progress.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"

#define REDRAW_MS 200

void cli_format_duration(double seconds, char *out, size_t outlen)
{
	long s = seconds < 0 ? 0 : (long)(seconds + 0.5);
	if (s < 60)
		snprintf(out, outlen, "%lds", s);
	else if (s < 3600)
		snprintf(out, outlen, "%ldm%02lds", s / 60, s % 60);
	else if (s < 86400)
		snprintf(out, outlen, "%ldh%02ldm", s / 3600, s % 3600 / 60);
	else
		snprintf(out, outlen, "%ldd%02ldh", s / 86400,
			 s % 86400 / 3600);
}

/* The line for a redrive: rows done of total, rate, time left. */
static void redrive_line(const struct cli_progress *c,
			 const struct store_progress_info *p, double secs,
			 char *line, size_t len)
{
	double rate = secs > 0 ? (double)p->done / secs : 0;
	char left[32] = "?";
	if (rate > 0 && p->total >= p->done)
		cli_format_duration((double)(p->total - p->done) / rate, left,
				    sizeof(left));
	snprintf(line, len,
		 "%s: %lld of %lld rows (%.0f%%), %.0f rows/s, about %s left "
		 "(Ctrl-C stops after this batch; done rows stay done)",
		 c->command, (long long)p->done, (long long)p->total,
		 p->total > 0 ? 100.0 * (double)p->done / (double)p->total
			      : 100.0,
		 rate, left);
}

/* The line for an index build: pg_stat_progress_create_index's phase and
 * its blocks or tuples. */
static void index_line(const struct cli_progress *c,
		       const struct store_progress_info *p, double secs,
		       char *line, size_t len)
{
	char took[32], part[96] = "";
	cli_format_duration(secs, took, sizeof(took));
	if (p->total > 0)
		snprintf(part, sizeof(part), ", %lld of %lld (%.0f%%)",
			 (long long)p->done, (long long)p->total,
			 100.0 * (double)p->done / (double)p->total);
	snprintf(line, len, "%s: index %s: %s%s, %s%s", c->command, p->what,
		 p->phase ? p->phase : "building", part, took,
		 p->finished ? "" : " so far");
}

static bool on_progress(void *ctx, const struct store_progress_info *p)
{
	struct cli_progress *c = ctx;
	int64_t now = clock_ms();
	bool last = (p->total > 0 && p->done >= p->total) || p->finished;
	if (c->on && (now - c->last_ms >= REDRAW_MS || last)) {
		char line[512];
		double secs = (double)(now - c->started_ms) / 1000.0;
		if (p->phase)
			index_line(c, p, secs, line, sizeof(line));
		else
			redrive_line(c, p, secs, line, sizeof(line));
		/* \r and erase-line: the line is redrawn in place. */
		fprintf(stderr, "\r\033[K%s", line);
		c->drawn = true;
		c->last_ms = now;
		/* A finished build keeps its line; what follows starts
		 * below it. */
		if (p->finished)
			cli_progress_end(c);
		fflush(stderr);
	}
	return !(c->stop && *c->stop);
}

void cli_progress_init(struct cli_progress *p, const char *command, bool quiet,
		       volatile sig_atomic_t *stop)
{
	*p = (struct cli_progress){
	    .watcher = {.fn = on_progress, .ctx = p},
	    .command = command,
	    .on = !quiet && isatty(STDERR_FILENO),
	    .started_ms = clock_ms(),
	    .stop = stop,
	};
}

void cli_progress_end(struct cli_progress *p)
{
	if (p->drawn)
		fprintf(stderr, "\n");
	p->drawn = false;
}

volatile sig_atomic_t cli_interrupted;

static void on_interrupt(int sig)
{
	(void)sig;
	cli_interrupted = 1;
}

/* Without SA_RESTART, so a sleep returns early. */
void cli_catch_interrupts(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_interrupt;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

bool cli_parse_interval(const char *text, int64_t *ms)
{
	char *end;
	errno = 0;
	long long v = strtoll(text, &end, 10);
	if (end == text || errno != 0 || v < 0 || v > 86400000LL)
		return false;
	static const struct {
		const char *unit;
		int64_t ms;
	} units[] = {
	    {"", 1000}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		if (strcmp(end, units[i].unit) == 0) {
			*ms = (int64_t)v * units[i].ms;
			return true;
		}
	}
	return false;
}
