/* SPDX-License-Identifier: MIT */
/*
 * The daemon's operating surface beside the loops: the HTTP server
 * (/healthz, /readyz, /metrics on OUTBOX_HTTP_ADDR, libmicrohttpd) and the
 * ops thread with its own Postgres session, which upserts this replica's
 * registry row every few seconds and refreshes the SQL-backed gauges
 * (backlog, oldest pending age, dead tuples, live replicas, ...) with one
 * cheap query per interval, never on the hot path.
 *
 * Called from the main thread only.
 */
#ifndef OUTBOX_OPS_H
#define OUTBOX_OPS_H

#include <stddef.h>

#include "relay.h"

/* Starts the HTTP server (unless the address is empty) and the ops
 * thread. Returns 0, or -1 with err (e.g. the port is taken). */
int ops_start(struct relay *r, char *err, size_t errlen);

/* First moment of shutdown: /readyz answers 503 from now on and the
 * registry row is marked draining. Returns at once. */
void ops_draining(struct relay *r);

/* Stops the server and the ops thread; safe if ops_start failed. */
void ops_stop(struct relay *r);

#endif
