/* SPDX-License-Identifier: MIT */
/*
 * The operator commands' --source (docs/design.md §13): which of
 * OUTBOX_TABLE's tables a command works on. Private to src/ops/; used by
 * the thread that runs the command.
 */
#ifndef OUTBOX_OPS_CLI_SOURCE_H
#define OUTBOX_OPS_CLI_SOURCE_H

#include <stdbool.h>

struct config;

/* Takes --source TABLE (or --source=TABLE) out of argv, so the commands'
 * own option parsers need not know it. Returns the new argc, or -1 with
 * the problem printed on stderr (cmd names the command). */
int cli_take_source(const char *cmd, int argc, char **argv);

/* Whether --source was given. */
bool cli_source_given(void);

/* The table the command works on: --source's, which must be one of
 * OUTBOX_TABLE's, or OUTBOX_TABLE's only one; NULL with the problem
 * printed when neither says which. */
const char *cli_source_table(const struct config *cfg, const char *cmd);

/* `migrate` of every table pattern matches now; how many failed. */
int cli_migrate_pattern(const char *cmd, const struct config *cfg,
			const char *pattern, bool quiet);

/* `migrate` of one table, its lines on stdout; 1 when it failed (said on
 * stderr). */
int cli_migrate_table(const char *cmd, const struct config *cfg,
		      const char *table, bool quiet);

#endif
