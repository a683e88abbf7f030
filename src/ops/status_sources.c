/* SPDX-License-Identifier: MIT */
/*
 * `status` of a relay of several sources without --source (docs/design.md
 * §13): one line per source, every listed table and every table a
 * pattern matches now in every database, the ones in trouble first.
 */
#include "cli_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "config/config.h"
#include "store/store.h"

/* One source as `status` shows it. */
struct source_row {
	char name[160];
	const char *state; /* ok, paused, failing, missing, unreachable */
	int rank;	   /* 0: cannot be read, 1: needs a look, 2: fine */
	struct store_gauges g;
	bool paused;
	char error[256];
};

struct rows {
	struct source_row *at;
	size_t n, cap;
};

/* A source's name as the relay writes it: "database/table" with several
 * databases. */
static void row_name(const struct config *cfg, size_t db, const char *table,
		     char *out, size_t outlen)
{
	if (config_n_databases(cfg) > 1)
		snprintf(out, outlen, "%s/%s", config_database_name(cfg, db),
			 table);
	else
		snprintf(out, outlen, "%s", table);
}

static struct source_row *row_add(struct rows *r, const struct config *cfg,
				  size_t db, const char *table)
{
	if (r->n == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 16;
		struct source_row *grown = realloc(r->at, cap * sizeof(*grown));
		if (!grown)
			return NULL;
		r->at = grown;
		r->cap = cap;
	}
	struct source_row *row = &r->at[r->n++];
	memset(row, 0, sizeof(*row));
	row_name(cfg, db, table, row->name, sizeof(row->name));
	return row;
}

/* Whether table of database db has its row already: a table listed and
 * matched by a pattern too is one source, as the relay counts it. */
static bool row_known(const struct rows *r, const struct config *cfg, size_t db,
		      const char *table)
{
	char name[sizeof(r->at->name)];
	row_name(cfg, db, table, name, sizeof(name));
	for (size_t i = 0; i < r->n; i++)
		if (strcmp(r->at[i].name, name) == 0)
			return true;
	return false;
}

/* Reads one source's gauges and pauses on the database's session (*first
 * holds its first open store, whose session the others share). */
static void row_read(struct source_row *row, struct store_options *o,
		     struct store **first, bool *down)
{
	char err[512];
	struct store *s = NULL;
	if (*down) {
		row->state = "unreachable";
		snprintf(row->error, sizeof(row->error),
			 "its database could not be reached");
		return;
	}
	int rc = store_open_sharing(&s, o, *first, err, sizeof(err));
	if (rc == STORE_OK) {
		char keys[1][STORE_PAUSE_KEY_MAX];
		size_t n = 0;
		rc = store_admin_gauges(s, &row->g, err, sizeof(err));
		if (rc == STORE_OK)
			rc = store_read_pauses(s, &row->paused, keys, 1, &n,
					       err, sizeof(err));
	}
	if (rc == STORE_RECONNECT && !*first)
		*down = true;
	if (rc != STORE_OK) {
		row->state =
		    rc == STORE_RECONNECT ? "unreachable"
		    : strstr(err, "42P01") || strstr(err, "does not exist")
			? "missing"
			: "failing";
		snprintf(row->error, sizeof(row->error), "%s", err);
	} else if (row->paused) {
		row->state = "paused";
		row->rank = 1;
	} else {
		row->state = row->g.failed > 0 ? "failed rows" : "ok";
		row->rank = row->g.failed > 0 ? 1 : 2;
	}
	if (s && !*first)
		*first = s;
	else
		store_close(s);
}

/* Trouble first, then the oldest pending row first, then by name. */
static int row_order(const void *pa, const void *pb)
{
	const struct source_row *a = pa, *b = pb;
	if (a->rank != b->rank)
		return a->rank - b->rank;
	if (a->g.oldest_pending_ms != b->g.oldest_pending_ms)
		return a->g.oldest_pending_ms > b->g.oldest_pending_ms ? -1 : 1;
	return strcmp(a->name, b->name);
}

/* The catalog of the database o names, opened at its first use, with
 * the oids of OUTBOX_TABLE's tables listed without a schema (*bare, *n_bare):
 * a pattern's match of one of those is that listed source, as the relay
 * counts it. */
struct catalog_look {
	struct store_catalog *c;
	uint32_t *bare;
	size_t n_bare;
};

static int catalog_look_open(struct catalog_look *k,
			     const struct store_options *o,
			     const struct config *cfg, char *err, size_t errlen)
{
	if (k->c)
		return STORE_OK;
	const char **names = calloc(cfg->n_tables + 1, sizeof(*names));
	k->bare = calloc(cfg->n_tables + 1, sizeof(*k->bare));
	int rc = STORE_ERROR;
	if (!names || !k->bare) {
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	k->n_bare = 0;
	for (size_t i = 0; i < cfg->n_tables; i++)
		if (table_is_bare(cfg->tables[i]))
			names[k->n_bare++] = cfg->tables[i];
	rc = store_catalog_open(&k->c, o, err, errlen);
	if (rc == STORE_OK)
		rc = store_catalog_oids(k->c, names, k->n_bare, k->bare, err,
					errlen);
out:
	free(names);
	return rc;
}

static void catalog_look_close(struct catalog_look *k)
{
	store_catalog_close(k->c);
	free(k->bare);
	memset(k, 0, sizeof(*k));
}

static bool catalog_look_bare(const struct catalog_look *k, uint32_t oid)
{
	for (size_t i = 0; i < k->n_bare; i++)
		if (k->bare[i] == oid && oid != 0)
			return true;
	return false;
}

/* Every source of database db: OUTBOX_TABLE's tables and what its
 * patterns match now. */
static int collect(struct rows *r, const struct config *cfg, size_t db)
{
	struct store_options o =
	    store_options_from_config(cfg, "outbox-relay/status", NULL);
	o.prepare = false;
	o.conninfo = config_database_url(cfg, db);
	struct store *first = NULL;
	struct catalog_look look = {0};
	bool down = false;
	for (size_t i = 0; i < cfg->n_tables; i++) {
		const char *t = cfg->tables[i];
		char *one[1] = {(char *)t};
		char **names = NULL, err[512];
		uint32_t *oids = NULL;
		size_t n = 0;
		if (!table_is_pattern(t)) {
			names = one;
			n = 1;
		} else if (down ||
			   catalog_look_open(&look, &o, cfg, err,
					     sizeof(err)) != STORE_OK ||
			   store_catalog_tables(look.c, t, &names, &oids, &n,
						err, sizeof(err)) != STORE_OK) {
			struct source_row *row = row_add(r, cfg, db, t);
			if (!row)
				goto oom;
			row->state = "unreachable";
			snprintf(row->error, sizeof(row->error), "%s",
				 down ? "its database could not be reached"
				      : err);
			down = true;
			continue;
		}
		for (size_t k = 0; k < n; k++) {
			if (row_known(r, cfg, db, names[k]) ||
			    (oids && catalog_look_bare(&look, oids[k])))
				continue;
			struct source_row *row = row_add(r, cfg, db, names[k]);
			if (!row) {
				if (table_is_pattern(t))
					store_names_free(names, n);
				free(oids);
				goto oom;
			}
			o.table = names[k];
			row_read(row, &o, &first, &down);
		}
		if (table_is_pattern(t))
			store_names_free(names, n);
		free(oids);
	}
	catalog_look_close(&look);
	store_close(first);
	return 0;
oom:
	catalog_look_close(&look);
	store_close(first);
	return -1;
}

static void print_text(const struct rows *r)
{
	size_t trouble = 0;
	for (size_t i = 0; i < r->n; i++)
		trouble += r->at[i].rank < 2;
	printf("%zu sources, %zu in trouble\n\n", r->n, trouble);
	printf("%-48s %-12s %10s %12s %8s %9s %11s\n", "SOURCE", "STATE",
	       "PENDING", "OLDEST (s)", "FAILED", "IN FLIGHT", "DEAD TUPLES");
	for (size_t i = 0; i < r->n; i++) {
		const struct source_row *row = &r->at[i];
		if (row->rank == 0) {
			printf("%-48s %-12s %s\n", row->name, row->state,
			       row->error);
			continue;
		}
		printf("%-48s %-12s %10lld %12.1f %8lld %9lld %11lld\n",
		       row->name, row->state, (long long)row->g.backlog,
		       (double)row->g.oldest_pending_ms / 1000,
		       (long long)row->g.failed, (long long)row->g.in_flight,
		       (long long)row->g.dead_tuples);
	}
	printf("\nOne source in full: outbox-relay status --source SOURCE\n");
}

static int print_json(const struct rows *r)
{
	cJSON *doc = cJSON_CreateObject();
	cJSON *list = doc ? cJSON_AddArrayToObject(doc, "sources") : NULL;
	for (size_t i = 0; list && i < r->n; i++) {
		const struct source_row *row = &r->at[i];
		cJSON *o = cJSON_CreateObject();
		if (!o || !cJSON_AddItemToArray(list, o)) {
			cJSON_Delete(o);
			list = NULL;
			break;
		}
		cJSON_AddStringToObject(o, "source", row->name);
		cJSON_AddStringToObject(o, "state", row->state);
		if (row->rank == 0) {
			cJSON_AddStringToObject(o, "error", row->error);
			continue;
		}
		cJSON_AddNumberToObject(o, "pending", (double)row->g.backlog);
		cJSON_AddNumberToObject(o, "oldest_pending_seconds",
					(double)row->g.oldest_pending_ms /
					    1000);
		cJSON_AddNumberToObject(o, "failed", (double)row->g.failed);
		cJSON_AddNumberToObject(o, "in_flight",
					(double)row->g.in_flight);
		cJSON_AddNumberToObject(o, "dead_tuples",
					(double)row->g.dead_tuples);
		cJSON_AddBoolToObject(o, "paused", row->paused);
	}
	char *text = list ? cJSON_Print(doc) : NULL;
	cJSON_Delete(doc);
	if (!text) {
		fprintf(stderr, "outbox-relay status: out of memory\n");
		return 1;
	}
	printf("%s\n", text);
	cJSON_free(text);
	return 0;
}

int cli_status_sources(const struct config *cfg, bool json)
{
	struct rows r = {0};
	int ret = 1;
	for (size_t db = 0; db < config_n_databases(cfg); db++)
		if (collect(&r, cfg, db) != 0) {
			fprintf(stderr, "outbox-relay status: out of memory\n");
			goto out;
		}
	qsort(r.at, r.n, sizeof(*r.at), row_order);
	ret = json ? print_json(&r) : (print_text(&r), 0);
	if (ret == 0)
		ret = fflush(stdout) == 0 ? 0 : 1;
	/* Some sources read is a status (the others' lines say why not);
	 * none read is a runtime failure, as for one source. */
	size_t read = 0;
	for (size_t i = 0; i < r.n; i++)
		read += r.at[i].rank > 0;
	if (ret == 0 && r.n > 0 && read == 0) {
		fprintf(stderr, "outbox-relay status: no source could be "
				"read (each line says why)\n");
		ret = 1;
	}
out:
	free(r.at);
	return ret;
}
