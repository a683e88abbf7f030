/* SPDX-License-Identifier: MIT */
/* /metrics: every metric of base in the Prometheus text exposition format. */
#ifndef OUTBOX_METRICS_TEXT_H
#define OUTBOX_METRICS_TEXT_H

#include <stdint.h>
#include <stdio.h>

void metrics_text_render(FILE *out);

/* Writes v as a label value: backslash, double quote and newline escaped. */
void metrics_text_put_label(FILE *out, const char *v);

/* The SQL-backed gauges (backlog, oldest pending age, ...) are refreshed
 * every base_ms, or less often when their query is slow: it counts every
 * pending row, so a backlog of millions makes it cost the database a
 * second or more. The pause after a refresh that took took_ms is at least
 * GAUGE_COST_FACTOR times that, which keeps the query's share of one
 * Postgres core at or below 1 / GAUGE_COST_FACTOR per replica. */
#define GAUGE_COST_FACTOR 100
int64_t metrics_gauge_pause_ms(int64_t base_ms, int64_t took_ms);

/*
 * How much a scan of the pending index steps over, from two readings of
 * its pg_stat_user_indexes counters {idx_scan, idx_tup_read,
 * idx_tup_fetch}, less own (the same counters of the gauge statements
 * read at before, which reach the cumulative ones in between): entries
 * returned minus live rows fetched, per scan, times 1000. An entry
 * returned without a visible row behind it is one a lease passed: a row
 * finished since the oldest snapshot, whose entry vacuum may not remove
 * yet. 0 when no scan ran; -1 when the counters went back (statistics
 * reset): the interval tells nothing.
 */
int64_t metrics_dead_entries_per_scan_milli(const int64_t before[3],
					    const int64_t after[3],
					    const int64_t own[3]);

/*
 * Publishes the holder of the xmin horizon as outbox_xmin_horizon_holder_info
 * (kind "" becomes "none"). A session that has held it less than
 * HORIZON_NAMED_AFTER_MS is shown by kind alone, name and pid empty: the
 * holder changes with every short transaction (the relay's own leases
 * among them), and a series per pid would pile up in Prometheus. A
 * session whose age is unknown (age_ms 0: no pg_read_all_stats), a slot
 * and a prepared transaction are always named. database: the listed
 * database it belongs to (OUTBOX_DATABASES; registries_horizons() says
 * which for a holder of no listed database), "" for none (then no
 * label).
 */
#define HORIZON_NAMED_AFTER_MS 10000
void metrics_publish_horizon_holder(const char *kind, const char *name,
				    int64_t pid, int64_t age_ms,
				    const char *database);

#endif
