/* SPDX-License-Identifier: MIT */
/*
 * Which of the relay's sources (OUTBOX_TABLE's tables) an operator
 * command works on, and `migrate` of one of them.
 */
#include "cli_source.h"

#include <stdio.h>
#include <string.h>

#include "config/config.h"
#include "progress.h"
#include "store/store.h"

/* The table --source named, "" when none was (main's thread only). */
static char cli_source[128];

int cli_take_source(const char *cmd, int argc, char **argv)
{
	int out = 0;
	cli_source[0] = '\0';
	for (int i = 0; i < argc; i++) {
		const char *v = NULL;
		if (strcmp(argv[i], "--source") == 0) {
			if (i + 1 >= argc) {
				fprintf(stderr,
					"outbox-relay %s: --source needs a "
					"table\n",
					cmd);
				return -1;
			}
			v = argv[++i];
		} else if (strncmp(argv[i], "--source=", 9) == 0) {
			v = argv[i] + 9;
		} else {
			argv[out++] = argv[i];
			continue;
		}
		snprintf(cli_source, sizeof(cli_source), "%s", v);
	}
	argv[out] = NULL;
	return out;
}

bool cli_source_given(void)
{
	return cli_source[0] != '\0';
}

const char *cli_source_table(const struct config *cfg, const char *cmd)
{
	if (cli_source[0]) {
		for (size_t i = 0; i < cfg->n_tables; i++)
			if (strcmp(cfg->tables[i], cli_source) == 0)
				return cfg->tables[i];
		fprintf(stderr,
			"outbox-relay %s: --source %s is not one of "
			"OUTBOX_TABLE's tables (%s)\n",
			cmd, cli_source, cfg->table);
		return NULL;
	}
	if (cfg->n_tables == 1)
		return cfg->tables[0];
	fprintf(stderr,
		"outbox-relay %s: OUTBOX_TABLE lists %zu tables; say which "
		"with --source TABLE\n",
		cmd, cfg->n_tables);
	return NULL;
}

int cli_migrate_table(const char *cmd, const struct config *cfg,
		      const char *table, bool quiet)
{
	char err[1024];
	struct store_options o =
	    store_options_from_config(cfg, "outbox-relay/cli", NULL);
	o.table = table;
	struct cli_progress p;
	cli_progress_init(&p, cmd, quiet, NULL);
	int rc =
	    store_migrate_watched(&o, cfg->listen, stdout,
				  p.on ? &p.watcher : NULL, err, sizeof(err));
	cli_progress_end(&p);
	if (rc != 0) {
		fprintf(stderr, "outbox-relay: %s\n", err);
		return 1;
	}
	printf("NOTIFY trigger %s (OUTBOX_LISTEN=%s)\n",
	       cfg->listen ? "present" : "absent", cfg->listen ? "on" : "off");
	printf("table %s is at schema version %d\n", table,
	       store_schema_version());
	return 0;
}
