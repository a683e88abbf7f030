/* SPDX-License-Identifier: MIT */
/*
 * Monotonic time for local deadlines and sleeps. Leases, backoff and
 * retention never use it: the database clock is the only clock for those.
 */
#ifndef OUTBOX_CLOCK_H
#define OUTBOX_CLOCK_H

#include <stdint.h>

/* Milliseconds on CLOCK_MONOTONIC. */
int64_t clock_ms(void);
/* Microseconds since the epoch on CLOCK_REALTIME (latency metrics only). */
int64_t clock_wall_us(void);
/* Sleeps ms milliseconds (restarting after signals). */
void clock_sleep_ms(int64_t ms);

#endif
