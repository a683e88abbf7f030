/* SPDX-License-Identifier: MIT */
/*
 * The per-source series of /metrics (docs/design.md §13): the first
 * OUTBOX_METRICS_SOURCES sources of the list, each under its name, the
 * rest summed under source="(other)". The first N rather than the busiest N: a
 * source keeps its series for the relay's life, so no counter ever moves
 * between series and rate() stays right.
 */
#include "metrics_sources.h"
#include "metrics_text.h"

#include "config/config.h"
#include "loops/loops.h"

/* The rest's label: no source is named so (a name is SQL identifiers,
 * dots and a slash). */
#define OTHER "(other)"

static void events(FILE *out, const char *source, bool other,
		   const struct relay_source_stats *st)
{
	static const char *const outcomes[] = {"sent", "retried", "failed"};
	const uint64_t counts[] = {st->sent, st->retried, st->failed};
	for (int k = 0; k < 3; k++) {
		fputs("outbox_source_events_total{source=\"", out);
		metrics_text_put_label(out, other ? OTHER : source);
		fprintf(out, "\",outcome=\"%s\"} %llu\n", outcomes[k],
			(unsigned long long)counts[k]);
	}
}

/* A source whose table was not read (or is gone) has no series; the
 * rest's is their sum, left out while none of them was read. */
static void dead_tuples(FILE *out, struct relay *r, size_t n, size_t own)
{
	fputs("# HELP outbox_source_dead_tuples Dead tuples of each source's "
	      "table (its partitions summed; source=\"" OTHER "\": the sum "
	      "of the rest).\n"
	      "# TYPE outbox_source_dead_tuples gauge\n",
	      out);
	int64_t other = 0;
	bool other_known = false;
	for (size_t i = 0; i < n; i++) {
		struct relay_source_stats st;
		relay_source_stats(r, i, &st);
		if (st.dead_tuples < 0 || st.gone)
			continue;
		if (i >= own) {
			other += st.dead_tuples;
			other_known = true;
			continue;
		}
		fputs("outbox_source_dead_tuples{source=\"", out);
		metrics_text_put_label(out, relay_source_name(r, i));
		fprintf(out, "\"} %lld\n", (long long)st.dead_tuples);
	}
	if (other_known)
		fprintf(out,
			"outbox_source_dead_tuples{source=\"" OTHER "\"} "
			"%lld\n",
			(long long)other);
}

void metrics_sources_render(FILE *out, struct relay *r)
{
	if (!r)
		return;
	size_t n = relay_sources_n(r);
	size_t own = (size_t)relay_config(r)->metrics_sources;
	struct relay_source_stats other = {0};
	size_t failing = 0, gone = 0, other_failing = 0;
	fputs("# HELP outbox_source_events_total Events of each source by "
	      "outcome (beyond OUTBOX_METRICS_SOURCES: source=\"" OTHER "\").\n"
	      "# TYPE outbox_source_events_total counter\n",
	      out);
	for (size_t i = 0; i < n; i++) {
		struct relay_source_stats st;
		relay_source_stats(r, i, &st);
		failing += st.failing;
		gone += st.gone;
		if (i < own) {
			events(out, relay_source_name(r, i), false, &st);
			continue;
		}
		other.sent += st.sent;
		other.retried += st.retried;
		other.failed += st.failed;
		other_failing += st.failing;
	}
	if (n > own)
		events(out, NULL, true, &other);
	fputs("# HELP outbox_source_failing Sources set aside after a failure "
	      "(1 each; source=\"" OTHER "\": how many of the rest).\n"
	      "# TYPE outbox_source_failing gauge\n",
	      out);
	for (size_t i = 0; i < n && i < own; i++) {
		struct relay_source_stats st;
		relay_source_stats(r, i, &st);
		fputs("outbox_source_failing{source=\"", out);
		metrics_text_put_label(out, relay_source_name(r, i));
		fprintf(out, "\"} %d\n", st.failing ? 1 : 0);
	}
	if (n > own)
		fprintf(out,
			"outbox_source_failing{source=\"" OTHER "\"} %zu\n",
			other_failing);
	fputs("# HELP outbox_source_lag_seconds Age of the oldest event of "
	      "each source's last leased batch when it was leased (0: that "
	      "lease found nothing; source=\"" OTHER "\": the most of the "
	      "rest).\n"
	      "# TYPE outbox_source_lag_seconds gauge\n",
	      out);
	int64_t other_lag = 0;
	for (size_t i = 0; i < n; i++) {
		struct relay_source_stats st;
		relay_source_stats(r, i, &st);
		if (i >= own) {
			other_lag =
			    st.lag_ms > other_lag ? st.lag_ms : other_lag;
			continue;
		}
		fputs("outbox_source_lag_seconds{source=\"", out);
		metrics_text_put_label(out, relay_source_name(r, i));
		fprintf(out, "\"} %.3f\n", (double)st.lag_ms / 1000);
	}
	if (n > own)
		fprintf(out,
			"outbox_source_lag_seconds{source=\"" OTHER
			"\"} %.3f\n",
			(double)other_lag / 1000);
	dead_tuples(out, r, n, own);
	fprintf(out,
		"# HELP outbox_sources Sources of this relay by state.\n"
		"# TYPE outbox_sources gauge\n"
		"outbox_sources{state=\"served\"} %zu\n"
		"outbox_sources{state=\"failing\"} %zu\n"
		"outbox_sources{state=\"gone\"} %zu\n",
		n - gone, failing, gone);
}
