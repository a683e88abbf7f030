/* SPDX-License-Identifier: MIT */
/*
 * Operator subcommands beyond run/migrate/check: status, redrive, pause,
 * resume, unblock. Each parses its own arguments (--help per subcommand),
 * prints its result, and returns the exit code (0 ok, 1 runtime failure,
 * 2 usage error with a usage line on stderr).
 */
#ifndef OUTBOX_CLI_H
#define OUTBOX_CLI_H

#include <stdbool.h>

#include "config.h"

/* Usage lines for the subcommands, for the top-level --help. */
const char *cli_usage_lines(void);

/* True when cmd is one of the subcommands here. */
bool cli_knows(const char *cmd);

/* Runs subcommand argv[0] with its arguments argv[1..argc-1]. */
int cli_run(const char *cmd, int argc, char **argv, const struct config *cfg);

#endif
