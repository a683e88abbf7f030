/* SPDX-License-Identifier: MIT */
/*
 * The per-source series of /metrics (docs/design.md §13): the first
 * OUTBOX_METRICS_SOURCES sources of the list, each under its name, the
 * rest under source="(other)" (summed; the lag their largest). The first
 * N rather than the busiest N: a source keeps its series for the relay's
 * life, so no counter ever moves between series and rate() stays right.
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

/* One gauge of every source (HELP and TYPE before): the first own under
 * their names, the rest combined under OTHER, summed (sum) or their
 * largest; a value below 0 means no series, and OTHER has one only when
 * some of the rest had a value. value: source i's, -1 for none; in
 * thousandths when milli (printed with three decimals). */
static void
per_source_gauge(FILE *out, struct relay *r, size_t n, size_t own,
		 const char *name, bool sum, bool milli,
		 int64_t (*value)(const struct relay_source_stats *))
{
	int64_t other = 0;
	bool other_known = false;
	for (size_t i = 0; i < n; i++) {
		struct relay_source_stats st;
		relay_source_stats(r, i, &st);
		int64_t v = value(&st);
		if (v < 0)
			continue;
		if (i >= own) {
			other = sum ? other + v : v > other ? v : other;
			other_known = true;
			continue;
		}
		fprintf(out, "%s{source=\"", name);
		metrics_text_put_label(out, relay_source_name(r, i));
		if (milli)
			fprintf(out, "\"} %.3f\n", (double)v / 1000);
		else
			fprintf(out, "\"} %lld\n", (long long)v);
	}
	if (!other_known)
		return;
	if (milli)
		fprintf(out, "%s{source=\"" OTHER "\"} %.3f\n", name,
			(double)other / 1000);
	else
		fprintf(out, "%s{source=\"" OTHER "\"} %lld\n", name,
			(long long)other);
}

static int64_t failing_of(const struct relay_source_stats *st)
{
	return st->failing ? 1 : 0;
}

/* A source whose table is gone has no series: its last lease's lag,
 * kept, would fire OutboxSourceLagging for good. */
static int64_t lag_of(const struct relay_source_stats *st)
{
	return st->gone ? -1 : st->lag_ms;
}

/* A source whose table was not read (or is gone) has no series. */
static int64_t dead_of(const struct relay_source_stats *st)
{
	return st->gone ? -1 : st->dead_tuples;
}

void metrics_sources_render(FILE *out, struct relay *r)
{
	if (!r)
		return;
	size_t n = relay_sources_n(r);
	size_t own = (size_t)relay_config(r)->metrics_sources;
	struct relay_source_stats other = {0};
	size_t failing = 0, gone = 0;
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
	}
	if (n > own)
		events(out, NULL, true, &other);
	fputs("# HELP outbox_source_failing Sources set aside after a failure "
	      "(1 each; source=\"" OTHER "\": how many of the rest).\n"
	      "# TYPE outbox_source_failing gauge\n",
	      out);
	per_source_gauge(out, r, n, own, "outbox_source_failing", true, false,
			 failing_of);
	fputs("# HELP outbox_source_lag_seconds Age of the oldest event of "
	      "each source's last leased batch when it was leased (0: that "
	      "lease found nothing; source=\"" OTHER "\": the most of the "
	      "rest).\n"
	      "# TYPE outbox_source_lag_seconds gauge\n",
	      out);
	per_source_gauge(out, r, n, own, "outbox_source_lag_seconds", false,
			 true, lag_of);
	fputs("# HELP outbox_source_dead_tuples Dead tuples of each source's "
	      "table (its partitions summed; source=\"" OTHER "\": the sum "
	      "of the rest).\n"
	      "# TYPE outbox_source_dead_tuples gauge\n",
	      out);
	per_source_gauge(out, r, n, own, "outbox_source_dead_tuples", true,
			 false, dead_of);
	fprintf(out,
		"# HELP outbox_sources Sources of this relay by state.\n"
		"# TYPE outbox_sources gauge\n"
		"outbox_sources{state=\"served\"} %zu\n"
		"outbox_sources{state=\"failing\"} %zu\n"
		"outbox_sources{state=\"gone\"} %zu\n",
		n - gone, failing, gone);
}
