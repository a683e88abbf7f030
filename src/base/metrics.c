/* SPDX-License-Identifier: MIT */
/* Atomic counters, gauges and histograms (ops renders them). */
#include "base.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const double latency_bounds[] = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double batch_bounds[] = {1,   5,	10,   25,   50,
				      100, 250, 1000, 5000, 10000};

struct histogram_shape {
	const double *bounds;
	int n_bounds;
	bool seconds; /* observations in microseconds */
};

static const struct histogram_shape histogram_shapes[MH_COUNT] = {
    [MH_BATCH_SIZE] = {batch_bounds, 10, false},
    [MH_LEASE_SECONDS] = {latency_bounds, 14, true},
    [MH_MARK_SECONDS] = {latency_bounds, 14, true},
    [MH_SWEEP_SECONDS] = {latency_bounds, 14, true},
    [MH_PUBLISH_SECONDS] = {latency_bounds, 14, true},
    [MH_END_TO_END_SECONDS] = {latency_bounds, 14, true},
};

struct histogram {
	atomic_ullong buckets[METRICS_MAX_BUCKETS];
	atomic_ullong sum;
	atomic_ullong count;
};

static atomic_ullong counters[MC_COUNT];
static atomic_llong gauges[MG_COUNT];

/* More than any relay runs lanes (OUTBOX_WORKERS x OUTBOX_WINDOW). */
#define LEASE_SLOTS 1024
/* clock_ms() when the slot's open lease began; 0: none open. */
static atomic_llong lease_since[LEASE_SLOTS];
static atomic_int lease_slots_taken;
static struct histogram histograms[MH_COUNT];
static pthread_mutex_t info_lock = PTHREAD_MUTEX_INITIALIZER;
static char infos[MI_COUNT][METRICS_INFO_LABELS][METRICS_INFO_VALUE_MAX];

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

int metrics_lease_slot(void)
{
	int slot = atomic_fetch_add_explicit(&lease_slots_taken, 1,
					     memory_order_relaxed);
	return slot < LEASE_SLOTS ? slot : -1;
}

void metrics_lease_open(int slot, int64_t since_ms)
{
	/* clock_ms() is never 0 past boot, but 0 means "none". */
	if (slot >= 0)
		atomic_store_explicit(&lease_since[slot],
				      since_ms > 0 ? since_ms : 1,
				      memory_order_relaxed);
}

void metrics_lease_closed(int slot)
{
	if (slot >= 0)
		atomic_store_explicit(&lease_since[slot], 0,
				      memory_order_relaxed);
}

static int64_t oldest_lease_ms(void)
{
	int n = atomic_load_explicit(&lease_slots_taken, memory_order_relaxed);
	int64_t oldest = 0;
	for (int i = 0; i < n && i < LEASE_SLOTS; i++) {
		int64_t since =
		    atomic_load_explicit(&lease_since[i], memory_order_relaxed);
		if (since > 0 && (oldest == 0 || since < oldest))
			oldest = since;
	}
	if (oldest == 0)
		return 0;
	int64_t age = clock_ms() - oldest;
	return age > 0 ? age : 0;
}

int64_t metrics_gauge(enum metric_gauge g)
{
	if (g == MG_OLDEST_LEASE_MS)
		return oldest_lease_ms();
	return atomic_load_explicit(&gauges[g], memory_order_relaxed);
}

void metrics_set_info(enum metric_info i,
		      const char *const values[METRICS_INFO_LABELS])
{
	pthread_mutex_lock(&info_lock);
	for (int l = 0; l < METRICS_INFO_LABELS; l++)
		snprintf(infos[i][l], sizeof(infos[i][l]), "%s",
			 values[l] ? values[l] : "");
	pthread_mutex_unlock(&info_lock);
}

void metrics_info(enum metric_info i,
		  char values[METRICS_INFO_LABELS][METRICS_INFO_VALUE_MAX])
{
	pthread_mutex_lock(&info_lock);
	memcpy(values, infos[i], sizeof(infos[i]));
	pthread_mutex_unlock(&info_lock);
}

void metrics_observe(enum metric_histogram h, uint64_t value)
{
	const struct histogram_shape *d = &histogram_shapes[h];
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

void metrics_histogram_read(enum metric_histogram h,
			    struct metrics_histogram *out)
{
	const struct histogram_shape *d = &histogram_shapes[h];
	out->bounds = d->bounds;
	out->n_bounds = d->n_bounds;
	out->seconds = d->seconds;
	for (int b = 0; b < d->n_bounds; b++)
		out->buckets[b] = atomic_load(&histograms[h].buckets[b]);
	out->count = atomic_load(&histograms[h].count);
	out->sum = atomic_load(&histograms[h].sum);
}
