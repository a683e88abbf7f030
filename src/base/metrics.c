/* SPDX-License-Identifier: MIT */
/* Atomic counters, gauges and histograms; Prometheus text rendering. */
#include "base.h"

#include <stdbool.h>

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
			"Rows a mark found no longer held by its lease."},
    [MC_MARKS_ALREADY] = {"outbox_marks_recovered_total", "",
			  "Rows found already marked after a lost reply."},
    [MC_LEASES] = {"outbox_leases_total", "", "Lease statements run."},
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
    [MC_DB_RECONNECTS] = {"outbox_db_reconnects_total", "",
			  "Postgres sessions re-established."},
    [MC_PUBLISHER_FAILURES] = {"outbox_publisher_failures_total", "",
			       "Publisher opens or health probes that "
			       "failed."},
    [MC_RENEWALS] = {"outbox_lease_renewals_total", "",
		     "Lease renewals while awaiting broker outcomes."},
    [MC_RENEWAL_LOST] = {"outbox_lease_renewal_lost_rows_total", "",
			 "Rows a renewal found no longer held."},
    [MC_IN_DOUBT] = {"outbox_in_doubt_events_total", "",
		     "Events handed to the broker whose outcome never "
		     "came (retried keeping their charge; a source of "
		     "duplicates)."},
};

struct gauge_def {
	const char *name;
	const char *help;
	double scale; /* rendered value = raw / scale */
};

static const struct gauge_def gauge_defs[MG_COUNT] = {
    [MG_PUBLISHERS_UNHEALTHY] = {"outbox_publishers_unhealthy",
				 "Workers whose publisher is unhealthy.", 1},
    [MG_DESTINATIONS_PAUSED] = {"outbox_destinations_paused",
				"Destinations paused after refusing "
				"events.",
				1},
    [MG_PAUSED_GLOBALLY] = {"outbox_paused",
			    "1 while an operator pause stops all leasing.", 1},
    [MG_LAST_SWEEP_MS] = {"outbox_last_sweep_timestamp_seconds",
			  "Unix time of the last successful sweep.", 1000},
    [MG_LAST_CLEAN_MS] = {"outbox_last_clean_timestamp_seconds",
			  "Unix time of the last successful clean.", 1000},
    [MG_BACKLOG] = {"outbox_backlog_events", "Pending rows.", 1},
    [MG_OLDEST_PENDING_MS] = {"outbox_oldest_pending_age_seconds",
			      "Age of the oldest pending row.", 1000},
    [MG_IN_FLIGHT] = {"outbox_in_flight_events", "Leased rows.", 1},
    [MG_FAILED_ROWS] = {"outbox_failed_events", "Rows in failed state.", 1},
    [MG_DEAD_TUPLES] = {"outbox_table_dead_tuples",
			"Dead tuples in the outbox table.", 1},
    [MG_LIVE_REPLICAS] = {"outbox_live_replicas",
			  "Replicas seen in the registry recently.", 1},
    [MG_BLOCKED_KEYS] = {"outbox_blocked_keys",
			 "Partition keys blocked by a failed row.", 1},
    [MG_NOTIFY_QUEUE_PPM] = {"outbox_notify_queue_usage_ratio",
			     "Fraction of the NOTIFY queue in use.", 1e6},
    [MG_KAFKA_QUEUE_DEPTH] = {"outbox_kafka_queue_depth",
			      "Messages waiting in librdkafka queues.", 1},
};

static const double latency_bounds[] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double batch_bounds[] = {1,   5,	10,   25,   50,
				      100, 250, 1000, 5000, 10000};

#define MAX_BUCKETS 16

struct histogram_def {
	const char *name;
	const char *help;
	const double *bounds;
	int n_bounds;
	bool seconds; /* observations in microseconds */
};

static const struct histogram_def histogram_defs[MH_COUNT] = {
    [MH_BATCH_SIZE] = {"outbox_batch_size", "Rows per leased batch.",
		       batch_bounds, 10, false},
    [MH_LEASE_SECONDS] = {"outbox_lease_duration_seconds",
			  "Lease statement duration.", latency_bounds, 14,
			  true},
    [MH_MARK_SECONDS] = {"outbox_mark_duration_seconds",
			 "Mark statement duration.", latency_bounds, 14, true},
    [MH_SWEEP_SECONDS] = {"outbox_sweep_duration_seconds",
			  "Sweep tick duration.", latency_bounds, 14, true},
    [MH_PUBLISH_SECONDS] = {"outbox_publish_duration_seconds",
			    "Time to publish a batch and await its "
			    "outcomes.",
			    latency_bounds, 14, true},
    [MH_END_TO_END_SECONDS] = {"outbox_end_to_end_latency_seconds",
			       "From the row's created_at to its broker "
			       "acknowledgement.",
			       latency_bounds, 14, true},
};

struct histogram {
	atomic_ullong buckets[MAX_BUCKETS];
	atomic_ullong sum;
	atomic_ullong count;
};

static atomic_ullong counters[MC_COUNT];
static atomic_llong gauges[MG_COUNT];
static struct histogram histograms[MH_COUNT];

void metrics_add(enum metric_counter c, uint64_t n)
{
	atomic_fetch_add_explicit(&counters[c], n, memory_order_relaxed);
}

uint64_t metrics_get(enum metric_counter c)
{
	return atomic_load_explicit(&counters[c], memory_order_relaxed);
}

void metrics_set(enum metric_gauge g, int64_t v)
{
	atomic_store_explicit(&gauges[g], v, memory_order_relaxed);
}

void metrics_gauge_add(enum metric_gauge g, int64_t delta)
{
	atomic_fetch_add_explicit(&gauges[g], delta, memory_order_relaxed);
}

int64_t metrics_gauge(enum metric_gauge g)
{
	return atomic_load_explicit(&gauges[g], memory_order_relaxed);
}

void metrics_observe(enum metric_histogram h, uint64_t value)
{
	const struct histogram_def *d = &histogram_defs[h];
	double v = d->seconds ? (double)value / 1e6 : (double)value;
	for (int i = 0; i < d->n_bounds; i++)
		if (v <= d->bounds[i])
			atomic_fetch_add_explicit(&histograms[h].buckets[i], 1,
						  memory_order_relaxed);
	atomic_fetch_add_explicit(&histograms[h].sum, value,
				  memory_order_relaxed);
	atomic_fetch_add_explicit(&histograms[h].count, 1,
				  memory_order_relaxed);
}

void metrics_render(FILE *out)
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
	for (int i = 0; i < MG_COUNT; i++) {
		const struct gauge_def *d = &gauge_defs[i];
		fprintf(out, "# HELP %s %s\n# TYPE %s gauge\n", d->name,
			d->help, d->name);
		int64_t raw = metrics_gauge(i);
		if (d->scale == 1)
			fprintf(out, "%s %lld\n", d->name, (long long)raw);
		else
			fprintf(out, "%s %.6f\n", d->name,
				(double)raw / d->scale);
	}
	for (int i = 0; i < MH_COUNT; i++) {
		const struct histogram_def *d = &histogram_defs[i];
		struct histogram *h = &histograms[i];
		fprintf(out, "# HELP %s %s\n# TYPE %s histogram\n", d->name,
			d->help, d->name);
		for (int b = 0; b < d->n_bounds; b++)
			fprintf(
			    out, "%s_bucket{le=\"%g\"} %llu\n", d->name,
			    d->bounds[b],
			    (unsigned long long)atomic_load(&h->buckets[b]));
		unsigned long long count = atomic_load(&h->count);
		fprintf(out, "%s_bucket{le=\"+Inf\"} %llu\n", d->name, count);
		unsigned long long sum = atomic_load(&h->sum);
		if (d->seconds)
			fprintf(out, "%s_sum %.6f\n", d->name,
				(double)sum / 1e6);
		else
			fprintf(out, "%s_sum %llu\n", d->name, sum);
		fprintf(out, "%s_count %llu\n", d->name, count);
	}
}
