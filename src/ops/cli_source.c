/* SPDX-License-Identifier: MIT */
/*
 * Which of the relay's sources (OUTBOX_TABLE's tables) an operator
 * command works on, and `migrate` of one of them.
 */
#include "cli_source.h"

#include <stdio.h>
#include <stdlib.h>
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
		/* Empty, it would read as no --source: every table. */
		if (v[0] == '\0' || strlen(v) >= sizeof(cli_source)) {
			fprintf(stderr,
				"outbox-relay %s: --source needs a table%s\n",
				cmd,
				v[0] ? " name shorter than 128 bytes" : "");
			return -1;
		}
		if (cli_source[0]) {
			fprintf(stderr,
				"outbox-relay %s: --source given twice\n", cmd);
			return -1;
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

/* As the relay's cleaner does at each round (docs/design.md §11,
 * "Partitions by the day"), two days ahead: for a relay whose
 * role may not make or drop tables, the table's owner runs `migrate
 * --partition` daily. Prints what it did. */
static int tend_partitions(const struct store_options *o,
			   const struct config *cfg, char *err, size_t errlen)
{
	struct store *s = NULL;
	struct partition_result pr;
	int rc = store_open(&s, o, err, errlen);
	/* The days the running relays keep, which the drops must not cut,
	 * not this command's shell's. */
	if (rc == 0) {
		struct store_kept own = {.sent_ms = cfg->retention_ms,
					 .failed_ms = cfg->failed_retention_ms};
		struct store_kept kept =
		    store_admin_kept(s, own, STORE_KEPT_LIVE);
		rc = store_partitions_tend(s, 2, kept.sent_ms, kept.failed_ms,
					   &pr, err, errlen);
	}
	store_close(s);
	if (rc == 0)
		printf("partitions made ahead: %zu, dropped: %zu, rows "
		       "carried to the default partition: %zu, days kept "
		       "for their rows: %zu%s\n",
		       pr.created, pr.dropped, pr.carried, pr.kept,
		       pr.busy ? " (some locks were taken: run it again)" : "");
	return rc;
}

/* Of --source "database/table": the database's index, the table part in
 * *table; -1 with the problem printed when it names no database. */
static int source_database(const struct config *cfg, const char *cmd,
			   const char **table)
{
	*table = cli_source;
	if (config_n_databases(cfg) == 1)
		return 0;
	const char *slash = strchr(cli_source, '/');
	int d = slash ? config_database_index(cfg, cli_source,
					      (size_t)(slash - cli_source))
		      : -1;
	if (d < 0) {
		fprintf(stderr,
			"outbox-relay %s: --source %s: with several databases "
			"a source is DATABASE/TABLE, a database of "
			"OUTBOX_DATABASES (%s)\n",
			cmd, cli_source, cfg->databases_list);
		return -1;
	}
	*table = slash + 1;
	return d;
}

const char *cli_source_table(const struct config *cfg, const char *cmd,
			     const char **conninfo)
{
	*conninfo = config_database_url(cfg, 0);
	if (cli_source[0]) {
		const char *t;
		int d = source_database(cfg, cmd, &t);
		if (d < 0)
			return NULL;
		*conninfo = config_database_url(cfg, (size_t)d);
		for (size_t i = 0; i < cfg->n_tables; i++)
			if (strcmp(cfg->tables[i], t) == 0 &&
			    !table_is_pattern(t))
				return cfg->tables[i];
		for (size_t i = 0; i < cfg->n_tables; i++) {
			if (!table_is_pattern(cfg->tables[i]) ||
			    !table_pattern_match(cfg->tables[i], t))
				continue;
			/* A pattern's * matches any text, not only a
			 * name. */
			struct outbox_table parsed;
			char why[256];
			if (table_parse(t, &parsed, why, sizeof(why)) != 0) {
				fprintf(stderr,
					"outbox-relay %s: --source %s: %s\n",
					cmd, cli_source, why);
				return NULL;
			}
			return t;
		}
		fprintf(stderr,
			"outbox-relay %s: --source %s is not one of "
			"OUTBOX_TABLE's tables (%s)\n",
			cmd, cli_source, cfg->table);
		return NULL;
	}
	bool one_table =
	    cfg->n_tables == 1 && !table_is_pattern(cfg->tables[0]);
	if (one_table && config_n_databases(cfg) == 1)
		return cfg->tables[0];
	if (one_table)
		fprintf(stderr,
			"outbox-relay %s: OUTBOX_DATABASES names %zu "
			"databases; say which with --source DATABASE/%s\n",
			cmd, config_n_databases(cfg), cfg->tables[0]);
	else if (cfg->n_tables == 1)
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

/* Which part of `migrate` a pass over the tables does: all of it, for
 * one table; for several with contract steps, first the expand
 * migrations and the steps' records, every table's, then the steps, so
 * that the wait for the relays' heartbeats (STORE_CONTRACT_SETTLE_MS)
 * is one for them all instead of one a table. */
enum migrate_pass { PASS_ALL, PASS_EXPAND, PASS_CONTRACT };

/* The tables (their database's index and name) whose expand pass
 * failed, not contracted by the next pass. */
struct migrate_failed {
	char **names;
	size_t n;
};

static char *failed_key(size_t d, const char *table)
{
	char *key = NULL;
	return asprintf(&key, "%zu/%s", d, table) < 0 ? NULL : key;
}

static bool failed_before(const struct migrate_failed *f, const char *key)
{
	for (size_t i = 0; key && i < f->n; i++)
		if (strcmp(f->names[i], key) == 0)
			return true;
	return false;
}

static void failed_add(struct migrate_failed *f, char *key)
{
	char **grown =
	    key ? realloc(f->names, (f->n + 1) * sizeof(*grown)) : NULL;
	if (!grown) {
		/* Out of memory: the table is contracted again, and fails
		 * again, said twice. */
		free(key);
		return;
	}
	f->names = grown;
	f->names[f->n++] = key;
}

static int migrate_one(const char *cmd, const struct config *cfg,
		       const char *conninfo, const char *table,
		       const struct cli_migrate *m, enum migrate_pass pass)
{
	char err[1024];
	struct store_options o =
	    store_options_from_config(cfg, "outbox-relay/cli", NULL);
	o.table = table;
	o.conninfo = conninfo;
	if (pass != PASS_CONTRACT) {
		struct cli_progress p;
		cli_progress_init(&p, cmd, m->quiet, NULL);
		int rc = store_migrate_watched(&o, cfg->listen, stdout,
					       p.on ? &p.watcher : NULL, err,
					       sizeof(err));
		cli_progress_end(&p);
		if (rc != 0) {
			fprintf(stderr, "outbox-relay: %s\n", err);
			return 1;
		}
		printf("NOTIFY trigger %s (OUTBOX_LISTEN=%s)\n",
		       cfg->listen ? "present" : "absent",
		       cfg->listen ? "on" : "off");
		printf("table %s is at schema version %d\n", table,
		       store_schema_version());
	}
	if (pass == PASS_EXPAND) {
		fflush(stdout);
		if (store_contract_record(&o, m->contract, m->partition, stdout,
					  err, sizeof(err)) != 0) {
			fprintf(stderr, "outbox-relay: %s\n", err);
			return 1;
		}
		return 0;
	}
	if (m->contract) {
		fflush(stdout);
		if (store_contract(&o, stdout, err, sizeof(err)) != 0) {
			fprintf(stderr, "outbox-relay: %s\n", err);
			return 1;
		}
		printf("table %s needs relays of protocol %d\n", table,
		       STORE_PROTOCOL);
	}
	if (m->partition) {
		fflush(stdout);
		if (store_partition(&o, stdout, err, sizeof(err)) != 0 ||
		    tend_partitions(&o, cfg, err, sizeof(err)) != 0) {
			fprintf(stderr, "outbox-relay: %s\n", err);
			return 1;
		}
		printf("table %s is partitioned by id\n", table);
	}
	return 0;
}

int cli_migrate_table(const char *cmd, const struct config *cfg,
		      const char *conninfo, const char *table,
		      const struct cli_migrate *m)
{
	return migrate_one(cmd, cfg, conninfo, table, m, PASS_ALL);
}

/* migrate_one() of one of several tables in pass, after the expand pass
 * (failed: the tables it failed on, skipped now) or before the contract
 * pass (failed: where to add them); 1 when it failed. */
static int migrate_of_many(const char *cmd, const struct config *cfg, size_t d,
			   const char *table, const struct cli_migrate *m,
			   enum migrate_pass pass,
			   struct migrate_failed *failed)
{
	char *key = failed_key(d, table);
	if (pass == PASS_CONTRACT && failed_before(failed, key)) {
		printf("(skipped: it failed above)\n");
		free(key);
		return 0;
	}
	int rc =
	    migrate_one(cmd, cfg, config_database_url(cfg, d), table, m, pass);
	if (rc != 0 && pass == PASS_EXPAND)
		failed_add(failed, key);
	else
		free(key);
	return rc;
}

/* `migrate` of every table pattern matches now in database d; how many
 * failed. *tables grows by the tables matched (by one for a pattern whose
 * lookup failed, which counts as one failure, once across the passes). */
static int migrate_pattern(const char *cmd, const struct config *cfg, size_t d,
			   const char *pattern, const struct cli_migrate *m,
			   enum migrate_pass pass,
			   struct migrate_failed *failed, size_t *tables)
{
	char err[1024];
	struct store_options o =
	    store_options_from_config(cfg, "outbox-relay/cli", NULL);
	o.table = pattern;
	o.conninfo = config_database_url(cfg, d);
	char **names = NULL;
	size_t n = 0;
	char *key = failed_key(d, pattern);
	if (pass == PASS_CONTRACT && failed_before(failed, key)) {
		(*tables)++;
		printf("pattern %s: (skipped: it failed above)\n", pattern);
		free(key);
		return 0;
	}
	if (store_catalog_match(&o, pattern, &names, &n, err, sizeof(err)) !=
	    0) {
		fprintf(stderr, "outbox-relay: pattern %s: %s\n", pattern, err);
		(*tables)++;
		if (pass == PASS_EXPAND)
			failed_add(failed, key);
		else
			free(key);
		return 1;
	}
	free(key);
	*tables += n;
	/* A pattern creates nothing: it names the tables there are. */
	printf("pattern %s matches %zu tables%s\n", pattern, n,
	       pass == PASS_CONTRACT ? ": their contract steps" : "");
	int fails = 0;
	for (size_t i = 0; i < n; i++) {
		printf("table %s (%zu of %zu):\n", names[i], i + 1, n);
		fails +=
		    migrate_of_many(cmd, cfg, d, names[i], m, pass, failed);
	}
	store_names_free(names, n);
	return fails;
}

/* One pass over every table of OUTBOX_TABLE in every database; how many
 * failed. *tables gets how many there were. */
static int migrate_all(const char *cmd, const struct config *cfg,
		       const struct cli_migrate *m, enum migrate_pass pass,
		       struct migrate_failed *failed, size_t *tables)
{
	int fails = 0;
	size_t dbs = config_n_databases(cfg);
	*tables = 0;
	for (size_t d = 0; d < dbs; d++) {
		if (dbs > 1)
			printf("database %s (%zu of %zu):\n",
			       config_database_name(cfg, d), d + 1, dbs);
		for (size_t i = 0; i < cfg->n_tables; i++) {
			const char *table = cfg->tables[i];
			if (table_is_pattern(table)) {
				fails += migrate_pattern(cmd, cfg, d, table, m,
							 pass, failed, tables);
				continue;
			}
			(*tables)++;
			if (cfg->n_tables > 1)
				printf("table %s (%zu of %zu):\n", table, i + 1,
				       cfg->n_tables);
			fails += migrate_of_many(cmd, cfg, d, table, m, pass,
						 failed);
		}
	}
	return fails;
}

int cli_migrate_sources(const char *cmd, const struct config *cfg,
			const struct cli_migrate *m)
{
	if (cli_source_given()) {
		/* --source: that table, listed or matched. */
		const char *conninfo;
		const char *only = cli_source_table(cfg, cmd, &conninfo);
		if (!only)
			return 2;
		return cli_migrate_table(cmd, cfg, conninfo, only, m) ? 1 : 0;
	}
	bool one = config_n_databases(cfg) == 1 && cfg->n_tables == 1 &&
		   !table_is_pattern(cfg->tables[0]);
	if (one)
		return cli_migrate_table(cmd, cfg, config_database_url(cfg, 0),
					 cfg->tables[0], m)
			   ? 1
			   : 0;
	struct migrate_failed failed = {0};
	size_t tables = 0;
	bool steps = m->contract || m->partition;
	int fails = migrate_all(cmd, cfg, m, steps ? PASS_EXPAND : PASS_ALL,
				&failed, &tables);
	if (steps) {
		printf("contract steps of every table, once their records "
		       "settled:\n");
		fails +=
		    migrate_all(cmd, cfg, m, PASS_CONTRACT, &failed, &tables);
	}
	for (size_t i = 0; i < failed.n; i++)
		free(failed.names[i]);
	free(failed.names);
	if (fails > 0 && tables > 1)
		fprintf(stderr,
			"outbox-relay: %d of %zu tables failed to "
			"migrate\n",
			fails, tables);
	return fails > 0 ? 1 : 0;
}
