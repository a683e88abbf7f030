/* SPDX-License-Identifier: MIT */
/*
 * `outbox-relay status --watch`: the backlog and how fast it drains,
 * redrawn every interval (progress.h). Throughput is read from the rows
 * themselves (finished within the interval), so even the first frame has
 * it; the drain rate is the backlog's change between two frames, so the
 * time to drain appears from the second.
 */
#include "progress.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "config/config.h"

/* What one frame shows, and the frame before it for the drain rate. */
struct frame {
	double at; /* database clock, seconds */
	double pending, due_now, retrying, suspects, oldest_s;
	double sent, failed_permanent, failed_spent, failed_total;
	double in_flight, window_s;
	const cJSON *holders;
	double drain_per_s; /* rows/s the backlog shrank since the last frame */
	bool has_drain;
};

static double num(const cJSON *o, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
	return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

static void read_frame(const cJSON *w, const struct frame *prev,
		       struct frame *f)
{
	*f = (struct frame){
	    .at = num(w, "at"),
	    .pending = num(w, "pending"),
	    .due_now = num(w, "due_now"),
	    .retrying = num(w, "retrying"),
	    .suspects = num(w, "crash_suspects"),
	    .oldest_s = num(w, "oldest_pending_age_seconds"),
	    .sent = num(w, "sent"),
	    .failed_permanent = num(w, "failed_permanent"),
	    .failed_spent = num(w, "failed_attempts_spent"),
	    .failed_total = num(w, "failed_total"),
	    .in_flight = num(w, "in_flight"),
	    .window_s = num(w, "window_seconds"),
	    .holders =
		cJSON_GetObjectItemCaseSensitive(w, "in_flight_by_holder"),
	};
	if (prev && f->at > prev->at) {
		f->drain_per_s =
		    (prev->pending - f->pending) / (f->at - prev->at);
		f->has_drain = true;
	}
}

/* "about 2m03s", "growing by 12/s", "nothing pending", "measuring". */
static void drain_text(const struct frame *f, char *out, size_t len)
{
	char eta[32];
	if (f->pending == 0)
		snprintf(out, len, "nothing pending");
	else if (!f->has_drain)
		snprintf(out, len, "measuring (next frame)");
	else if (f->drain_per_s > 0) {
		cli_format_duration(f->pending / f->drain_per_s, eta,
				    sizeof(eta));
		snprintf(out, len, "about %s (shrinking by %.1f/s)", eta,
			 f->drain_per_s);
	} else if (f->drain_per_s < 0)
		snprintf(out, len, "not draining: growing by %.1f/s",
			 -f->drain_per_s);
	else
		snprintf(out, len, "not draining: steady");
}

static void draw_tty(const struct frame *f, const char *table,
		     double interval_s, FILE *out)
{
	char drain[96], oldest[32], every[32];
	time_t now = time(NULL);
	struct tm tm;
	char stamp[32];
	gmtime_r(&now, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &tm);
	drain_text(f, drain, sizeof(drain));
	cli_format_duration(f->oldest_s, oldest, sizeof(oldest));
	config_format_duration((int64_t)(interval_s * 1000), every,
			       sizeof(every));
	/* Home and clear: the frame is redrawn in place. */
	fprintf(out, "\033[H\033[2J");
	fprintf(out,
		"outbox-relay status --watch  %s  every %s  %s  (Ctrl-C "
		"stops)\n\n",
		table, every, stamp);
	fprintf(out, "BACKLOG     %.0f pending, %.0f due now, oldest %s\n",
		f->pending, f->due_now, f->pending > 0 ? oldest : "-");
	fprintf(out, "THROUGHPUT  %.1f sent/s over the last %.1fs\n",
		f->window_s > 0 ? f->sent / f->window_s : 0, f->window_s);
	fprintf(out, "DRAINED IN  %s\n", drain);
	fprintf(out, "IN FLIGHT   %.0f\n", f->in_flight);
	const cJSON *h;
	cJSON_ArrayForEach(h, f->holders)
	{
		const cJSON *name =
		    cJSON_GetObjectItemCaseSensitive(h, "holder");
		fprintf(out, "  %-40s %6.0f rows, %.0f expired\n",
			cJSON_IsString(name) ? name->valuestring : "?",
			num(h, "rows"), num(h, "expired"));
	}
	fprintf(
	    out,
	    "FAILURES    in the last %.1fs: %.0f failed at once (permanent), "
	    "%.0f failed with attempts spent\n"
	    "            now: %.0f retrying in backoff (event or transport), "
	    "%.0f crash suspects (lease expired), %.0f failed in all\n",
	    f->window_s, f->failed_permanent, f->failed_spent, f->retrying,
	    f->suspects, f->failed_total);
}

/* One line per interval, key=value, for logs and pipes. */
static void draw_plain(const struct frame *f, FILE *out)
{
	time_t now = time(NULL);
	struct tm tm;
	char stamp[32], eta[32] = "-";
	gmtime_r(&now, &tm);
	strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &tm);
	char drain[32] = "?";
	if (f->has_drain && f->drain_per_s > 0 && f->pending > 0)
		snprintf(eta, sizeof(eta), "%.0f", f->pending / f->drain_per_s);
	if (f->pending == 0)
		snprintf(eta, sizeof(eta), "0");
	if (f->has_drain)
		snprintf(drain, sizeof(drain), "%.1f", f->drain_per_s);
	fprintf(out,
		"%s pending=%.0f due_now=%.0f oldest_pending_s=%.1f "
		"sent_per_s=%.1f drain_per_s=%s drained_in_s=%s in_flight=%.0f",
		stamp, f->pending, f->due_now, f->oldest_s,
		f->window_s > 0 ? f->sent / f->window_s : 0, drain, eta,
		f->in_flight);
	const cJSON *h;
	cJSON_ArrayForEach(h, f->holders)
	{
		const cJSON *name =
		    cJSON_GetObjectItemCaseSensitive(h, "holder");
		fprintf(out, " in_flight[%s]=%.0f",
			cJSON_IsString(name) ? name->valuestring : "?",
			num(h, "rows"));
	}
	fprintf(out,
		" failed_permanent=%.0f failed_attempts_spent=%.0f "
		"retrying=%.0f crash_suspects=%.0f failed_total=%.0f\n",
		f->failed_permanent, f->failed_spent, f->retrying, f->suspects,
		f->failed_total);
}

/* Sleeps ms in slices, returning early once *stop is set. */
static void nap(int64_t ms, volatile sig_atomic_t *stop)
{
	int64_t until = clock_ms() + ms;
	while (!*stop && clock_ms() < until) {
		int64_t left = until - clock_ms();
		clock_sleep_ms(left < 100 ? left : 100);
	}
}

int status_watch(struct store *s, const char *table, int64_t interval_ms,
		 FILE *out, bool tty, volatile sig_atomic_t *stop)
{
	struct frame prev = {0};
	bool have_prev = false;
	cJSON *kept = NULL; /* prev.holders points into it */
	char err[1024];
	while (!*stop) {
		cJSON *w = NULL;
		int rc =
		    store_admin_watch(s, interval_ms, &w, err, sizeof(err));
		if (rc == 0) {
			struct frame f;
			read_frame(w, have_prev ? &prev : NULL, &f);
			if (tty)
				draw_tty(&f, table,
					 (double)interval_ms / 1000.0, out);
			else
				draw_plain(&f, out);
			cJSON_Delete(kept);
			kept = w;
			prev = f;
			have_prev = true;
		} else {
			fprintf(out, "%s%s (retrying every interval)\n",
				tty ? "\033[H\033[2J" : "", err);
			if (rc == STORE_RECONNECT)
				store_reconnect(s, err, sizeof(err));
		}
		if (fflush(out) != 0) {
			cJSON_Delete(kept);
			return 1;
		}
		nap(interval_ms, stop);
	}
	cJSON_Delete(kept);
	return 0;
}
