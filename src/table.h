/* SPDX-License-Identifier: MIT */
/*
 * The outbox table's name, validated once and rendered every way the SQL
 * needs it. Derived names (indexes, functions, side tables, the NOTIFY
 * channel) append at most TABLE_SUFFIX_MAX bytes to the bare name, so the
 * name is limited to keep them within Postgres' 63-byte identifiers.
 */
#ifndef OUTBOX_TABLE_H
#define OUTBOX_TABLE_H

#include <stddef.h>

#define TABLE_SUFFIX_MAX 20
#define TABLE_NAME_MAX (63 - TABLE_SUFFIX_MAX)

struct outbox_table {
	char schema[64];   /* "" when unqualified */
	char name[64];	   /* bare, validated */
	char quoted[140];  /* "schema"."name" or "name" */
	char prefix[70];   /* "schema". or "" */
	char literal[140]; /* 'schema.name' or 'name' */
};

/*
 * Parses "name" or "schema.name": each part starts with a letter or
 * underscore, continues with letters, digits or underscores, and is at
 * most TABLE_NAME_MAX bytes. Returns 0, or -1 with err saying why.
 */
int table_parse(const char *text, struct outbox_table *t, char *err,
		size_t errlen);

/* Writes the quoted name of a side object: "schema"."<name><suffix>". */
void table_derived(const struct outbox_table *t, const char *suffix, char *out,
		   size_t outlen);

#endif
