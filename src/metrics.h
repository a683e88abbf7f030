/* SPDX-License-Identifier: MIT */
/*
 * Process-wide metrics, rendered in the Prometheus text format.
 *
 * Sharing: every field is a C11 atomic updated with relaxed ordering by
 * whichever thread observes the event; nothing else about them is shared.
 * A scrape may see counters mid-batch, which Prometheus tolerates.
 */
#ifndef OUTBOX_METRICS_H
#define OUTBOX_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum metric_counter {
	MC_SENT,	  /* broker acknowledged, marked sent */
	MC_RELEASED,	  /* never written: released */
	MC_DESTINATION,	  /* destination refused: released, paused */
	MC_TRANSPORT,	  /* outcome unknown: retried, charged */
	MC_EVENT,	  /* nacked: retried or failed when spent */
	MC_PERMANENT,	  /* failed at once */
	MC_LOST_LEASES,	  /* marks fenced off */
	MC_MARKS_ALREADY, /* lost replies recognized */
	MC_LEASES,	  /* lease statements run */
	MC_SWEEPS,	  /* sweep ticks that held the lock */
	MC_SWEPT_PENDING,
	MC_SWEPT_FAILED,
	MC_CLEANS,
	MC_CLEANED_SENT,
	MC_CLEANED_FAILED,
	MC_DB_RECONNECTS,
	MC_PUBLISHER_FAILURES, /* probes or opens that failed */
	MC_RENEWALS,
	MC_RENEWAL_LOST, /* rows a renewal found no longer held */
	MC_IN_DOUBT,	 /* handed to the broker, outcome unknown */
	MC_COUNT
};

enum metric_gauge {
	MG_PUBLISHERS_UNHEALTHY, /* workers whose publisher is down */
	MG_DESTINATIONS_PAUSED,
	MG_PAUSED_GLOBALLY, /* 1 while an operator pause is in force */
	MG_LAST_SWEEP_MS,   /* wall clock ms of the last sweep */
	MG_LAST_CLEAN_MS,
	MG_BACKLOG,	      /* pending rows (http thread) */
	MG_OLDEST_PENDING_MS, /* age of the oldest pending row */
	MG_IN_FLIGHT,
	MG_FAILED_ROWS,
	MG_DEAD_TUPLES,
	MG_LIVE_REPLICAS,
	MG_BLOCKED_KEYS,
	MG_NOTIFY_QUEUE_PPM, /* pg_notification_queue_usage() * 1e6 */
	MG_KAFKA_QUEUE_DEPTH,
	MG_COUNT
};

enum metric_histogram {
	MH_BATCH_SIZE,
	MH_LEASE_SECONDS,
	MH_MARK_SECONDS,
	MH_SWEEP_SECONDS,
	MH_PUBLISH_SECONDS,
	MH_END_TO_END_SECONDS,
	MH_COUNT
};

void metrics_add(enum metric_counter c, uint64_t n);
uint64_t metrics_get(enum metric_counter c);
void metrics_set(enum metric_gauge g, int64_t v);
void metrics_gauge_add(enum metric_gauge g, int64_t delta);
int64_t metrics_gauge(enum metric_gauge g);
/* Seconds-valued histograms take microseconds; MH_BATCH_SIZE a count. */
void metrics_observe(enum metric_histogram h, uint64_t value);

/* Writes every metric in the Prometheus text exposition format. */
void metrics_render(FILE *out);

#endif
