/* SPDX-License-Identifier: MIT */
/* The metrics base keeps, named and rendered for Prometheus (/metrics). */
#include "metrics_text.h"

#include <string.h>

#include "base/base.h"

struct counter_def {
	const char *name;
	const char *labels; /* "" or {k="v"} */
	const char *help;
};

/* Rows sharing a name are rendered under one HELP/TYPE header, so they
 * must be adjacent. */
static const struct counter_def counter_defs[MC_COUNT] = {
    [MC_SENT] = {"outbox_events_total", "{outcome=\"sent\",class=\"none\"}",
		 "Events by outcome and failure class."},
    [MC_RELEASED] = {"outbox_events_total",
		     "{outcome=\"released\",class=\"none\"}", NULL},
    [MC_DESTINATION] = {"outbox_events_total",
			"{outcome=\"released\",class=\"destination\"}", NULL},
    [MC_TRANSPORT] = {"outbox_events_total",
		      "{outcome=\"retried\",class=\"transport\"}", NULL},
    [MC_EVENT] = {"outbox_events_total",
		  "{outcome=\"retried\",class=\"event\"}", NULL},
    [MC_PERMANENT] = {"outbox_events_total",
		      "{outcome=\"failed\",class=\"permanent\"}", NULL},
    [MC_LOST_LEASES] = {"outbox_lost_leases_total", "",
			"Rows of leases that did not commit (they go out "
			"again)."},
    [MC_LEASES] = {"outbox_leases_total", "", "Lease statements run."},
    [MC_GIVEN_UP] = {"outbox_leases_given_up_total", "",
		     "Leases given up because their claim had no "
		     "reply in time (a pooler with no server "
		     "connection to spare)."},
    [MC_SWEEPS] = {"outbox_sweeps_total", "",
		   "Sweep ticks that held the sweep lock."},
    [MC_SWEPT_PENDING] = {"outbox_swept_rows_total", "{to=\"pending\"}",
			  "Expired leases returned by the sweeper."},
    [MC_SWEPT_FAILED] = {"outbox_swept_rows_total", "{to=\"failed\"}", NULL},
    [MC_CLEANS] = {"outbox_cleans_total", "",
		   "Clean ticks that held the clean lock."},
    [MC_CLEANED_SENT] = {"outbox_cleaned_rows_total", "{status=\"sent\"}",
			 "Terminal rows deleted after retention."},
    [MC_CLEANED_FAILED] = {"outbox_cleaned_rows_total", "{status=\"failed\"}",
			   NULL},
    [MC_PARTITIONS_MADE] = {"outbox_partitions_total", "{event=\"made\"}",
			    "Daily partitions of a partitioned table made "
			    "ahead, and dropped by retention."},
    [MC_PARTITIONS_DROPPED] = {"outbox_partitions_total", "{event=\"dropped\"}",
			       NULL},
    [MC_DB_RECONNECTS] = {"outbox_db_reconnects_total", "",
			  "Postgres sessions re-established."},
    [MC_LISTEN_PROBES_LOST] = {"outbox_listen_probes_lost_total", "",
			       "LISTEN sessions refused because their own "
			       "test notification did not reach them (a "
			       "transaction-mode pooler?)."},
    [MC_PREPARED] = {"outbox_statements_prepared_total", "",
		     "Statements prepared on a Postgres server session: "
		     "once a session, or with OUTBOX_PG_PREPARE=pooled once "
		     "a server connection of the pool (growing with every "
		     "batch: the pool throws them away)."},
    [MC_PUBLISHER_FAILURES] = {"outbox_publisher_failures_total", "",
			       "Publisher opens or health probes that "
			       "failed."},
    [MC_RENEWALS] = {"outbox_lease_renewals_total", "",
		     "Lease renewals while awaiting broker outcomes."},
    [MC_IN_DOUBT] = {"outbox_in_doubt_events_total", "",
		     "Events handed to the broker whose outcome never "
		     "came (retried keeping their charge; a source of "
		     "duplicates)."},
};

struct gauge_def {
	const char *name;
	const char *help; /* NULL: shares the previous row's header */
	double scale;	  /* rendered value = raw / scale */
	const char *labels;
};

static const struct gauge_def gauge_defs[MG_COUNT] = {
    [MG_PUBLISHERS_UNHEALTHY] = {"outbox_publishers_unhealthy",
				 "Workers whose publisher is unhealthy.", 1,
				 NULL},
    [MG_DESTINATIONS_PAUSED] = {"outbox_destinations_paused",
				"Destinations paused after refusing "
				"events.",
				1, NULL},
    [MG_PAUSED_GLOBALLY] = {"outbox_paused",
			    "1 while an operator pause stops all leasing (of "
			    "several tables: how many are paused).",
			    1, NULL},
    [MG_LAST_SWEEP_MS] = {"outbox_last_sweep_timestamp_seconds",
			  "Unix time of the last successful sweep.", 1000,
			  NULL},
    [MG_LAST_CLEAN_MS] = {"outbox_last_clean_timestamp_seconds",
			  "Unix time of the last successful clean.", 1000,
			  NULL},
    [MG_BACKLOG] = {"outbox_backlog_events", "Pending rows.", 1, NULL},
    [MG_OLDEST_PENDING_MS] = {"outbox_oldest_pending_age_seconds",
			      "Age of the oldest pending row.", 1000, NULL},
    [MG_IN_FLIGHT] = {"outbox_in_flight_events", "Leased rows.", 1, NULL},
    [MG_FAILED_ROWS] = {"outbox_failed_events", "Rows in failed state.", 1,
			NULL},
    [MG_DEAD_TUPLES] = {"outbox_table_dead_tuples",
			"Dead tuples in the outbox table.", 1, NULL},
    [MG_LIVE_REPLICAS] = {"outbox_live_replicas",
			  "Replicas seen in the registry recently.", 1, NULL},
    [MG_BLOCKED_KEYS] = {"outbox_blocked_keys",
			 "Partition keys blocked by a failed row.", 1, NULL},
    [MG_NOTIFY_QUEUE_PPM] = {"outbox_notify_queue_usage_ratio",
			     "Fraction of the NOTIFY queue in use.", 1e6, NULL},
    [MG_KAFKA_QUEUE_DEPTH] = {"outbox_kafka_queue_depth",
			      "Messages waiting in librdkafka queues.", 1,
			      NULL},
    [MG_OLDEST_LEASE_MS] = {"outbox_oldest_lease_transaction_seconds",
			    "Age of the oldest lease transaction open on "
			    "this relay (0: none).",
			    1000, NULL},
    [MG_XMIN_HORIZON_AGE_MS] = {"outbox_xmin_horizon_age_seconds",
				"How long the holder of the database's "
				"xmin horizon has held it (its transaction's "
				"age; 0 for a replication slot or when "
				"unknown).",
				1000, NULL},
    [MG_XMIN_HORIZON_XMIN_AGE] = {"outbox_xmin_horizon_age_transactions",
				  "age(xmin) of the database's xmin "
				  "horizon, in transactions.",
				  1, NULL},
    [MG_XMIN_AGE_SESSIONS] = {"outbox_xmin_age_transactions",
			      "Oldest age(xmin) in transactions of each "
			      "kind of holder (0: none).",
			      1, "{holder=\"session\"}"},
    [MG_XMIN_AGE_SLOTS] = {"outbox_xmin_age_transactions", NULL, 1,
			   "{holder=\"replication_slot\"}"},
    [MG_XMIN_AGE_PREPARED] = {"outbox_xmin_age_transactions", NULL, 1,
			      "{holder=\"prepared_transaction\"}"},
    [MG_LEASE_DEAD_ENTRIES_MILLI] = {"outbox_lease_dead_index_entries_per_"
				     "scan",
				     "Pending-index entries each scan passed "
				     "without finding a visible row, over the "
				     "last gauge interval.",
				     1000, NULL},
};

struct histogram_def {
	const char *name;
	const char *help;
};

static const struct histogram_def histogram_defs[MH_COUNT] = {
    [MH_BATCH_SIZE] = {"outbox_batch_size", "Rows per leased batch."},
    [MH_LEASE_SECONDS] = {"outbox_lease_duration_seconds",
			  "Lease statement duration."},
    [MH_MARK_SECONDS] = {"outbox_mark_duration_seconds",
			 "Mark statement duration."},
    [MH_SWEEP_SECONDS] = {"outbox_sweep_duration_seconds",
			  "Sweep tick duration."},
    [MH_PUBLISH_SECONDS] = {"outbox_publish_duration_seconds",
			    "Time to publish a batch and await its "
			    "outcomes."},
    [MH_END_TO_END_SECONDS] = {"outbox_end_to_end_latency_seconds",
			       "From the row's created_at to its broker "
			       "acknowledgement."},
};

static void render_counters(FILE *out)
{
	const char *last = "";
	for (int i = 0; i < MC_COUNT; i++) {
		const struct counter_def *d = &counter_defs[i];
		if (d->help && d->name != last) {
			/* Counter names end in _total; HELP/TYPE name the
			 * family without it, as the format expects. */
			fprintf(out, "# HELP %s %s\n# TYPE %s counter\n",
				d->name, d->help, d->name);
		}
		last = d->name;
		fprintf(out, "%s%s %llu\n", d->name, d->labels,
			(unsigned long long)metrics_get(i));
	}
}

static void render_gauges(FILE *out)
{
	for (int i = 0; i < MG_COUNT; i++) {
		const struct gauge_def *d = &gauge_defs[i];
		const char *labels = d->labels ? d->labels : "";
		if (d->help)
			fprintf(out, "# HELP %s %s\n# TYPE %s gauge\n", d->name,
				d->help, d->name);
		int64_t raw = metrics_gauge(i);
		if (d->scale == 1)
			fprintf(out, "%s%s %lld\n", d->name, labels,
				(long long)raw);
		else
			fprintf(out, "%s%s %.6f\n", d->name, labels,
				(double)raw / d->scale);
	}
}

/* A label value as the text format wants it: backslash, double quote and
 * newline escaped. */
void metrics_text_put_label(FILE *out, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			fprintf(out, "\\%c", *v);
		else if (*v == '\n')
			fputs("\\n", out);
		else
			fputc(*v, out);
	}
}

struct info_def {
	const char *name;
	const char *help;
	const char *labels[METRICS_INFO_LABELS];
	bool omit_empty[METRICS_INFO_LABELS]; /* left out when "" */
};

static const struct info_def info_defs[MI_COUNT] = {
    [MI_XMIN_HORIZON_HOLDER] =
	{"outbox_xmin_horizon_holder_info",
	 "Who holds the database's xmin horizon: kind "
	 "session, replication_slot, "
	 "prepared_transaction or none; name its "
	 "application_name, slot name or gid; pid a "
	 "session's (both empty for a session holding it under 10 s); "
	 "database, with OUTBOX_DATABASES, the listed database it belongs "
	 "to (else the first read on its server).",
	 {"kind", "name", "pid", "database"},
	 /* Without OUTBOX_DATABASES the series keeps the labels it had. */
	 {false, false, false, true}},
};

static void render_infos(FILE *out)
{
	for (int i = 0; i < MI_COUNT; i++) {
		const struct info_def *d = &info_defs[i];
		char values[METRICS_INFO_LABELS][METRICS_INFO_VALUE_MAX];
		metrics_info(i, values);
		fprintf(out, "# HELP %s %s\n# TYPE %s gauge\n%s{", d->name,
			d->help, d->name, d->name);
		const char *sep = "";
		for (int l = 0; l < METRICS_INFO_LABELS; l++) {
			if (d->omit_empty[l] && !values[l][0])
				continue;
			fprintf(out, "%s%s=\"", sep, d->labels[l]);
			sep = ",";
			metrics_text_put_label(out, values[l]);
			fputc('"', out);
		}
		fputs("} 1\n", out);
	}
}

static void render_histogram(FILE *out, const struct histogram_def *d,
			     const struct metrics_histogram *h)
{
	fprintf(out, "# HELP %s %s\n# TYPE %s histogram\n", d->name, d->help,
		d->name);
	for (int b = 0; b < h->n_bounds; b++)
		fprintf(out, "%s_bucket{le=\"%g\"} %llu\n", d->name,
			h->bounds[b], (unsigned long long)h->buckets[b]);
	fprintf(out, "%s_bucket{le=\"+Inf\"} %llu\n", d->name,
		(unsigned long long)h->count);
	if (h->seconds)
		fprintf(out, "%s_sum %.6f\n", d->name, (double)h->sum / 1e6);
	else
		fprintf(out, "%s_sum %llu\n", d->name,
			(unsigned long long)h->sum);
	fprintf(out, "%s_count %llu\n", d->name, (unsigned long long)h->count);
}

void metrics_text_render(FILE *out)
{
	render_counters(out);
	render_gauges(out);
	render_infos(out);
	for (int i = 0; i < MH_COUNT; i++) {
		struct metrics_histogram h;
		metrics_histogram_read(i, &h);
		render_histogram(out, &histogram_defs[i], &h);
	}
}

int64_t metrics_gauge_pause_ms(int64_t base_ms, int64_t took_ms)
{
	int64_t paced = took_ms > 0 ? took_ms * GAUGE_COST_FACTOR : 0;
	return paced > base_ms ? paced : base_ms;
}

int64_t metrics_dead_entries_per_scan_milli(const int64_t before[3],
					    const int64_t after[3],
					    const int64_t own[3])
{
	int64_t scans = after[0] - before[0], read = after[1] - before[1],
		fetched = after[2] - before[2];
	if (scans < 0 || read < 0 || fetched < 0)
		return -1;
	/* Own counts that have not reached the cumulative ones yet (a
	 * flush comes at most once a second) are not subtracted. */
	if (scans >= own[0] && read >= own[1] && fetched >= own[2]) {
		scans -= own[0];
		read -= own[1];
		fetched -= own[2];
	}
	if (scans == 0 || read <= fetched)
		return 0;
	return (read - fetched) * 1000 / scans;
}

void metrics_publish_horizon_holder(const char *kind, const char *name,
				    int64_t pid, int64_t age_ms,
				    const char *database)
{
	bool brief = strcmp(kind, "session") == 0 && age_ms > 0 &&
		     age_ms < HORIZON_NAMED_AFTER_MS;
	char pid_text[24] = "";
	if (pid > 0 && !brief)
		snprintf(pid_text, sizeof(pid_text), "%lld", (long long)pid);
	const char *values[METRICS_INFO_LABELS] = {
	    kind[0] ? kind : "none", brief ? "" : name, pid_text, database};
	metrics_set_info(MI_XMIN_HORIZON_HOLDER, values);
}
