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
 * OUTBOX_TABLE's (with several databases "DATABASE/TABLE"), or
 * OUTBOX_TABLE's only one in the only database; *conninfo gets its
 * database's URL. NULL with the problem printed when neither says which. */
const char *cli_source_table(const struct config *cfg, const char *cmd,
			     const char **conninfo);

/* What `migrate` does beside the expand migrations. */
struct cli_migrate {
	bool quiet;	/* no progress of index builds */
	bool contract;	/* the contract steps too (store_contract()) */
	bool partition; /* and the partition step (store_partition()) */
};

/* `migrate` of --source's table, or of every table of OUTBOX_TABLE (every
 * table a pattern matches now) in every database, each one's lines on
 * stdout; 0, 1 when any failed (said on stderr), 2 for a bad --source. */
int cli_migrate_sources(const char *cmd, const struct config *cfg,
			const struct cli_migrate *m);

/* `migrate` of one table in the database of conninfo, its lines on
 * stdout; 1 when it failed (said on stderr). */
int cli_migrate_table(const char *cmd, const struct config *cfg,
		      const char *conninfo, const char *table,
		      const struct cli_migrate *m);

/* `status` of every source (status_sources.c): one line each, every
 * database's listed tables and pattern matches, trouble first; as text
 * or JSON on stdout. 0, or 1 with the problem on stderr. */
int cli_status_sources(const struct config *cfg, bool json);

#endif
