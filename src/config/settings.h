/* SPDX-License-Identifier: MIT */
/*
 * Inside config: the row engine (settings.c) shared by the loader
 * (config.c) and the printers (help.c).
 */
#ifndef OUTBOX_CONFIG_SETTINGS_H
#define OUTBOX_CONFIG_SETTINGS_H

#include "config.h"

#define FILE_SUFFIX "_FILE"
/* Enough for every row of the core table and the groups. */
#define LOADER_BAD_MAX 128

typedef int setting_check_fn(const char *value, char *why, size_t whylen);

struct config_loader {
	FILE *errs;
	int problems;
	/* Names of the settings that had a problem: not cross-checked. */
	const char *bad[LOADER_BAD_MAX];
	size_t n_bad;
	/* struct config's warnings, CONFIG_WARNINGS_MAX bytes; NULL: none
	 * kept. */
	char *warnings;
};

/* Appends one warning line to ld->warnings (struct config). */
void loader_warn(struct config_loader *ld, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The core table (config.c), for the printers. */
extern const struct setting config_core_rows[];
extern const size_t config_core_n_rows;

/*
 * Reads the row's variable into its field of target (the struct the row's
 * offset is into), reporting any problem. check replaces the row's own
 * check of a SET_STRING value.
 */
void setting_load(struct config_loader *ld, const struct setting *s,
		  setting_check_fn *check, void *target);

/* Frees the row's string in target, if it has one. */
void setting_free(const struct setting *s, void *target);

/* Records that the setting called name had a problem. */
void loader_mark_bad(struct config_loader *ld, const char *name);

/* The constraint a value must meet, for errors, --help and the README;
 * "" for free-form strings. */
void setting_range(const struct setting *s, char *buf, size_t len);

/* The help text of row s: the extensions name what config cannot know
 * (the backends, for OUTBOX_PUBLISHER). */
const char *config_row_help(const struct config_extensions *ext,
			    const struct setting *s);

/* One item of a comma-separated list starting at p, blanks around it cut:
 * *item and *len; returns where the next item starts, NULL after the last. */
const char *config_list_item(const char *p, const char **item, size_t *len);

/* OUTBOX_DATABASES (databases.c): its check, the load of each database's
 * URLs once the core rows are read, their release, and whether name (n
 * bytes, no _FILE) is a per-database variable. */
int config_check_databases(const char *v, char *why, size_t whylen);
void config_databases_load(struct config_loader *ld, struct config *cfg,
			   int (*check_conninfo)(const char *, char *, size_t));
void config_databases_release(struct config *cfg);
bool config_database_var(const char *name, size_t n);

#endif
