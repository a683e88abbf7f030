/* SPDX-License-Identifier: MIT */
/*
 * The migrations of sql/, embedded at build time (sql/embed.py), and the
 * schema version they reach. Below both the session (store.c checks a
 * table's version at connect) and the migrator (migrate.c applies them),
 * so neither calls into the other. Private to src/store/.
 */
#ifndef OUTBOX_SCHEMA_H
#define OUTBOX_SCHEMA_H

struct sql_migration {
	int version;	  /* from the file name's numeric prefix */
	const char *name; /* file name */
	const char *sql;  /* text with {{table}}-style placeholders */
};

/* In version order; ends with a zeroed entry. */
extern const struct sql_migration sql_migrations[];

/* The newest version of sql_migrations[]: what a table needs for this
 * relay to run on it. */
extern const int sql_schema_version;

#endif
