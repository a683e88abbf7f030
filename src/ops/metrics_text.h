/* SPDX-License-Identifier: MIT */
/* /metrics: every metric of base in the Prometheus text exposition format. */
#ifndef OUTBOX_METRICS_TEXT_H
#define OUTBOX_METRICS_TEXT_H

#include <stdio.h>

void metrics_text_render(FILE *out);

#endif
