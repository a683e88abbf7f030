/* SPDX-License-Identifier: MIT */
/*
 * The per-source series of /metrics. Private to src/ops/; called by the
 * HTTP thread.
 */
#ifndef OUTBOX_OPS_METRICS_SOURCES_H
#define OUTBOX_OPS_METRICS_SOURCES_H

#include <stdio.h>

struct relay;

/* Writes the source series (a relay of one table has one source):
 * outbox_source_events_total{source,outcome},
 * outbox_source_failing{source}, outbox_source_lag_seconds{source},
 * outbox_source_dead_tuples{source} and
 * outbox_sources{state}. */
void metrics_sources_render(FILE *out, struct relay *r);

#endif
