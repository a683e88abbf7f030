/* SPDX-License-Identifier: MIT */
/*
 * Operations: the HTTP endpoints (/healthz, /readyz, /metrics), the replica
 * registry heartbeat, and the command-line subcommands (status, redrive,
 * pause, resume, unblock, check).
 */
#ifndef OUTBOX_OPS_H
#define OUTBOX_OPS_H

#include <stdbool.h>
#include <stddef.h>

#include "config/config.h"
#include "loops/loops.h"

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

/* Starts the HTTP server (unless the address is empty) and the ops
 * thread. Returns 0, or -1 with err (e.g. the port is taken). */
int ops_start(struct relay *r, char *err, size_t errlen);

/* First moment of shutdown: /readyz answers 503 from now on and the
 * registry row is marked draining. Returns at once. */
void ops_draining(struct relay *r);

/* Stops the server and the ops thread; safe if ops_start failed. False
 * when the thread did not stop in time (stuck in a connect): it still
 * reads the relay and its config, which must then outlive the process. */
bool ops_stop(struct relay *r);

/*
 * Operator subcommands beyond run/check: migrate, status (and its live
 * view, --watch), redrive, pause, resume, unblock. Each parses its own
 * arguments (--help per subcommand), prints its result, and returns the exit
 * code (0 ok, 1 runtime failure, 2 usage error with a usage line on stderr).
 */

/* Usage lines for the subcommands, for the top-level --help. */
const char *cli_usage_lines(void);

/* True when cmd is one of the subcommands here. */
bool cli_knows(const char *cmd);

/* When subcommand argv[0]'s first argument argv[1] asks for its help (-h
 * or --help): prints it and returns true. Before the settings are
 * loaded, so that help needs none of them right. */
bool cli_help_asked(int argc, char **argv);

/* Runs subcommand argv[0] with its arguments argv[1..argc-1]. */
int cli_run(const char *cmd, int argc, char **argv, const struct config *cfg);

#endif
