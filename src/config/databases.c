/* SPDX-License-Identifier: MIT */
/*
 * OUTBOX_DATABASES (docs/design.md §13): the names of several databases,
 * each with its URL in OUTBOX_DATABASE_URL_<NAME> (or _FILE) and, for
 * LISTEN behind a pooler, OUTBOX_LISTEN_DATABASE_URL_<NAME>. Without it a
 * relay has one database, OUTBOX_DATABASE_URL's.
 */
#include "config.h"
#include "settings.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define URL_PREFIX "OUTBOX_DATABASE_URL_"
#define LISTEN_PREFIX "OUTBOX_LISTEN_DATABASE_URL_"

/* One name of the list: [a-z0-9_], 1 to CONFIG_DATABASE_NAME_MAX bytes. */
static int check_name(const char *p, size_t len, size_t at, char *why,
		      size_t whylen)
{
	if (len == 0) {
		snprintf(why, whylen, "an empty database name in the list");
		return -1;
	}
	if (len > CONFIG_DATABASE_NAME_MAX) {
		snprintf(why, whylen,
			 "database %zu of the list is longer than %d bytes", at,
			 CONFIG_DATABASE_NAME_MAX);
		return -1;
	}
	if (len == 4 && strncmp(p, "file", 4) == 0) {
		/* OUTBOX_DATABASE_URL_FILE is OUTBOX_DATABASE_URL's file. */
		snprintf(why, whylen,
			 "database %zu of the list: file is not a name a "
			 "database can have here",
			 at);
		return -1;
	}
	if (len > 5 && strncmp(p + len - 5, "_file", 5) == 0) {
		/* OUTBOX_DATABASE_URL_<NAME>_FILE would read as the file of
		 * <NAME>'s URL. */
		snprintf(why, whylen,
			 "database %zu of the list: a name ending in _file is "
			 "not one a database can have here (its URL's "
			 "variable would read as another's file)",
			 at);
		return -1;
	}
	for (size_t i = 0; i < len; i++)
		if (!(islower((unsigned char)p[i]) ||
		      isdigit((unsigned char)p[i]) || p[i] == '_')) {
			snprintf(why, whylen,
				 "database %zu of the list: a name is "
				 "lower-case letters, digits and _",
				 at);
			return -1;
		}
	return 0;
}

/*
 * Splits v into out (CONFIG_DATABASES_MAX entries, names only) when out is
 * not NULL; checks only when it is. 0, or -1 with why set.
 */
static int split_names(const char *v, struct config_database *out, size_t *n,
		       char *why, size_t whylen)
{
	char names[CONFIG_DATABASES_MAX][CONFIG_DATABASE_NAME_MAX + 1];
	size_t count = 0;
	for (const char *next = v; next;) {
		const char *p;
		size_t len;
		next = config_list_item(next, &p, &len);
		if (check_name(p, len, count + 1, why, whylen) != 0)
			return -1;
		if (count == CONFIG_DATABASES_MAX) {
			snprintf(why, whylen, "more than %d databases",
				 CONFIG_DATABASES_MAX);
			return -1;
		}
		memcpy(names[count], p, len);
		names[count][len] = '\0';
		for (size_t i = 0; i < count; i++)
			if (strcmp(names[i], names[count]) == 0) {
				snprintf(why, whylen,
					 "database %s is listed twice",
					 names[count]);
				return -1;
			}
		count++;
	}
	if (count < 2) {
		snprintf(why, whylen,
			 "names at least two databases; for one, set "
			 "OUTBOX_DATABASE_URL instead");
		return -1;
	}
	for (size_t i = 0; out && i < count; i++)
		snprintf(out[i].name, sizeof(out[i].name), "%s", names[i]);
	if (n)
		*n = count;
	return 0;
}

int config_check_databases(const char *v, char *why, size_t whylen)
{
	return split_names(v, NULL, NULL, why, whylen);
}

/* prefix + the name upper-cased. */
static void var_of(const char *prefix, const char *name, char *out,
		   size_t outlen)
{
	size_t k = (size_t)snprintf(out, outlen, "%s", prefix);
	for (; *name && k + 1 < outlen; name++)
		out[k++] = (char)toupper((unsigned char)*name);
	out[k < outlen ? k : outlen - 1] = '\0';
}

/* Reads one URL variable of database d into *out, checked. False when a
 * problem was reported. */
static bool read_url(struct config_loader *ld, const char *var,
		     int (*check)(const char *, char *, size_t), char **out)
{
	char why[256];
	if (config_env_read(ld, var, out) < 0)
		return false;
	if (*out && **out == '\0') {
		free(*out);
		*out = NULL;
	}
	if (*out && check && check(*out, why, sizeof(why)) != 0) {
		config_problem(ld, var, true, *out, "%s", why);
		config_free_secret(*out, true);
		*out = NULL;
		return false;
	}
	return true;
}

/* A variable of prefix naming a database not listed is a mistake the
 * operator should hear of, not a setting silently unused. */
static void check_strays(struct config_loader *ld, const struct config *cfg,
			 const char *prefix)
{
	size_t plen = strlen(prefix);
	for (char **e = environ; e && *e; e++) {
		size_t n = strcspn(*e, "=");
		if (n <= plen || strncmp(*e, prefix, plen) != 0)
			continue;
		char var[128];
		snprintf(var, sizeof(var), "%.*s", (int)n, *e);
		size_t vlen = strlen(var);
		if (strcmp(var + plen, "FILE") == 0)
			continue; /* the file of the one-database variable */
		if (vlen > plen + 5 && strcmp(var + vlen - 5, "_FILE") == 0)
			var[vlen - 5] = '\0';
		bool known = false;
		for (size_t d = 0; d < cfg->n_databases && !known; d++) {
			char want[128];
			var_of(prefix, cfg->databases[d].name, want,
			       sizeof(want));
			known = strcmp(var, want) == 0;
		}
		if (known)
			continue;
		if (cfg->n_databases == 0)
			config_problem(ld, var, false, NULL,
				       "names a database, but "
				       "OUTBOX_DATABASES is not set");
		else
			config_problem(ld, var, false, NULL,
				       "names no database of OUTBOX_DATABASES "
				       "(%s)",
				       cfg->databases_list);
	}
}

void config_databases_load(struct config_loader *ld, struct config *cfg,
			   int (*check_conninfo)(const char *, char *, size_t))
{
	char why[256];
	if (!cfg->databases_list || !*cfg->databases_list) {
		/* A list refused (said already) is not one unset. */
		if (!config_loader_ok(ld, "OUTBOX_DATABASES"))
			return;
		check_strays(ld, cfg, URL_PREFIX);
		check_strays(ld, cfg, LISTEN_PREFIX);
		return;
	}
	if (!config_loader_ok(ld, "OUTBOX_DATABASES"))
		return;
	cfg->databases = calloc(CONFIG_DATABASES_MAX, sizeof(*cfg->databases));
	if (!cfg->databases) {
		config_problem(ld, "OUTBOX_DATABASES", false, NULL,
			       "out of memory");
		return;
	}
	if (split_names(cfg->databases_list, cfg->databases, &cfg->n_databases,
			why, sizeof(why)) != 0) {
		config_problem(ld, "OUTBOX_DATABASES", false, NULL, "%s", why);
		return;
	}
	if (cfg->database_url)
		config_problem(ld, "OUTBOX_DATABASE_URL", false, NULL,
			       "set with OUTBOX_DATABASES: each database has "
			       "its URL in OUTBOX_DATABASE_URL_<NAME>");
	if (cfg->listen_database_url)
		config_problem(ld, "OUTBOX_LISTEN_DATABASE_URL", false, NULL,
			       "set with OUTBOX_DATABASES: each database has "
			       "its LISTEN URL in "
			       "OUTBOX_LISTEN_DATABASE_URL_<NAME>");
	for (size_t d = 0; d < cfg->n_databases; d++) {
		struct config_database *db = &cfg->databases[d];
		char var[128];
		var_of(URL_PREFIX, db->name, var, sizeof(var));
		/* A URL refused (said already) is not one missing. */
		if (read_url(ld, var, check_conninfo, &db->url) && !db->url)
			config_problem(ld, var, false, NULL,
				       "not set: database %s of "
				       "OUTBOX_DATABASES needs its URL",
				       db->name);
		var_of(LISTEN_PREFIX, db->name, var, sizeof(var));
		read_url(ld, var, check_conninfo, &db->listen_url);
	}
	check_strays(ld, cfg, URL_PREFIX);
	check_strays(ld, cfg, LISTEN_PREFIX);
}

void config_databases_release(struct config *cfg)
{
	for (size_t d = 0; cfg->databases && d < cfg->n_databases; d++) {
		config_free_secret(cfg->databases[d].url, true);
		config_free_secret(cfg->databases[d].listen_url, true);
	}
	free(cfg->databases);
	cfg->databases = NULL;
	cfg->n_databases = 0;
}

bool config_database_var(const char *name, size_t n)
{
	size_t a = strlen(URL_PREFIX), b = strlen(LISTEN_PREFIX);
	return (n > a && strncmp(name, URL_PREFIX, a) == 0) ||
	       (n > b && strncmp(name, LISTEN_PREFIX, b) == 0);
}

size_t config_n_databases(const struct config *cfg)
{
	return cfg->n_databases ? cfg->n_databases : 1;
}

const char *config_database_name(const struct config *cfg, size_t d)
{
	return cfg->n_databases ? cfg->databases[d].name : "";
}

const char *config_database_url(const struct config *cfg, size_t d)
{
	return cfg->n_databases ? cfg->databases[d].url : cfg->database_url;
}

const char *config_listen_url(const struct config *cfg, size_t d)
{
	return cfg->n_databases ? cfg->databases[d].listen_url
				: cfg->listen_database_url;
}

void config_database_setting(const struct config *cfg, size_t d,
			     const char *base, char *out, size_t outlen)
{
	char prefix[128];
	const char *name = config_database_name(cfg, d);
	snprintf(prefix, sizeof(prefix), "%s%s", base, name[0] ? "_" : "");
	var_of(prefix, name, out, outlen);
}

int config_database_index(const struct config *cfg, const char *name,
			  size_t len)
{
	for (size_t d = 0; d < cfg->n_databases; d++)
		if (strlen(cfg->databases[d].name) == len &&
		    strncmp(cfg->databases[d].name, name, len) == 0)
			return (int)d;
	return -1;
}
