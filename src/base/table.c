/* SPDX-License-Identifier: MIT */
/* Validating and quoting the outbox table's name. */
#include "base.h"

#include <stdio.h>
#include <string.h>

static int part_ok(const char *s, size_t n)
{
	if (n == 0 || n > TABLE_NAME_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		int alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			    c == '_';
		int digit = c >= '0' && c <= '9';
		if (!alpha && !(digit && i > 0))
			return 0;
	}
	return 1;
}

int table_parse(const char *text, struct outbox_table *t, char *err,
		size_t errlen)
{
	memset(t, 0, sizeof(*t));
	const char *dot = strchr(text, '.');
	const char *name = dot ? dot + 1 : text;
	size_t schema_len = dot ? (size_t)(dot - text) : 0;
	size_t name_len = strlen(name);

	if ((dot && !part_ok(text, schema_len)) || !part_ok(name, name_len)) {
		/* Unquoted: callers that show the value add it themselves
		 * (config's "(got '...')"). */
		snprintf(err, errlen,
			 "table name is not 'name' or 'schema.name' made of "
			 "letters, digits and underscores, each part at most "
			 "%d bytes",
			 TABLE_NAME_MAX);
		return -1;
	}
	memcpy(t->schema, text, schema_len);
	memcpy(t->name, name, name_len);
	if (dot) {
		snprintf(t->prefix, sizeof(t->prefix), "\"%s\".", t->schema);
		snprintf(t->literal, sizeof(t->literal), "'%s.%s'", t->schema,
			 t->name);
	} else {
		snprintf(t->literal, sizeof(t->literal), "'%s'", t->name);
	}
	snprintf(t->quoted, sizeof(t->quoted), "%s\"%s\"", t->prefix, t->name);
	return 0;
}

void table_derived(const struct outbox_table *t, const char *suffix, char *out,
		   size_t outlen)
{
	snprintf(out, outlen, "%s\"%s%s\"", t->prefix, t->name, suffix);
}
