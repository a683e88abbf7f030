/* SPDX-License-Identifier: MIT */
/*
 * Which of the relay's sources (OUTBOX_TABLE's tables) an operator
 * command works on, and `migrate` of one of them.
 */
#include "cli_source.h"

#include <stdio.h>
#include <string.h>

#include "base/base.h"
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
			if (strcmp(cfg->tables[i], cli_source) == 0 &&
			    !table_is_pattern(cli_source))
				return cfg->tables[i];
		for (size_t i = 0; i < cfg->n_tables; i++)
			if (table_is_pattern(cfg->tables[i]) &&
			    table_pattern_match(cfg->tables[i], cli_source))
				return cli_source;
		fprintf(stderr,
			"outbox-relay %s: --source %s is not one of "
			"OUTBOX_TABLE's tables (%s)\n",
			cmd, cli_source, cfg->table);
		return NULL;
	}
	if (cfg->n_tables == 1 && !table_is_pattern(cfg->tables[0]))
		return cfg->tables[0];
	if (cfg->n_tables == 1)
		fprintf(stderr,
			"outbox-relay %s: OUTBOX_TABLE is a pattern; say which "
			"table with --source TABLE\n",
			cmd);
	else
		fprintf(stderr,
			"outbox-relay %s: OUTBOX_TABLE lists %zu tables; say "
			"which with --source TABLE\n",
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

int cli_migrate_pattern(const char *cmd, const struct config *cfg,
			const char *pattern, bool quiet)
{
	char err[1024];
	struct store_options o =
	    store_options_from_config(cfg, "outbox-relay/cli", NULL);
	o.table = pattern;
	struct store_catalog *c = NULL;
	char **names = NULL;
	size_t n = 0;
	int rc = store_catalog_open(&c, &o, err, sizeof(err));
	if (rc == 0)
		rc = store_catalog_tables(c, pattern, &names, &n, err,
					  sizeof(err));
	store_catalog_close(c);
	if (rc != 0) {
		fprintf(stderr, "outbox-relay: pattern %s: %s\n", pattern, err);
		return 1;
	}
	/* A pattern creates nothing: it names the tables there are. */
	printf("pattern %s matches %zu tables\n", pattern, n);
	int failed = 0;
	for (size_t i = 0; i < n; i++) {
		printf("table %s (%zu of %zu):\n", names[i], i + 1, n);
		failed += cli_migrate_table(cmd, cfg, names[i], quiet);
	}
	store_names_free(names, n);
	return failed;
}
