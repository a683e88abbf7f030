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

bool table_is_bare(const char *text)
{
	struct outbox_table t;
	char why[160];
	return !table_is_pattern(text) &&
	       table_parse(text, &t, why, sizeof(why)) == 0 &&
	       t.schema[0] == '\0';
}

bool table_is_pattern(const char *text)
{
	return strchr(text, '*') != NULL;
}

int table_pattern_parse(const char *text, char *like, size_t likelen,
			char *name, size_t namelen, char *err, size_t errlen)
{
	const char *dot = strchr(text, '.');
	size_t glob_len = dot ? (size_t)(dot - text) : 0;
	bool star = false,
	     ok = dot && glob_len > 0 && glob_len <= TABLE_NAME_MAX;
	for (size_t i = 0; ok && i < glob_len; i++) {
		char c = text[i];
		star |= c == '*';
		ok = c == '*' || c == '_' || (c >= 'a' && c <= 'z') ||
		     (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
	}
	struct outbox_table t;
	char why[160];
	if (!ok || !star || table_parse(dot + 1, &t, why, sizeof(why)) != 0) {
		snprintf(err, errlen,
			 "a table pattern is 'glob.name': a schema of letters, "
			 "digits, underscores and at least one *, then a table "
			 "name (no * there)");
		return -1;
	}
	size_t o = 0;
	for (size_t i = 0; i < glob_len && o + 3 < likelen; i++) {
		if (text[i] == '*') {
			like[o++] = '%';
		} else if (text[i] == '_') {
			like[o++] = '\\';
			like[o++] = '_';
		} else {
			like[o++] = text[i];
		}
	}
	like[o] = '\0';
	snprintf(name, namelen, "%s", t.name);
	return 0;
}

/* glob (with *) against s, both bounded by their lengths. */
static bool glob_match(const char *glob, size_t gn, const char *s, size_t sn)
{
	if (gn == 0)
		return sn == 0;
	if (glob[0] == '*') {
		for (size_t k = 0; k <= sn; k++)
			if (glob_match(glob + 1, gn - 1, s + k, sn - k))
				return true;
		return false;
	}
	return sn > 0 && glob[0] == s[0] &&
	       glob_match(glob + 1, gn - 1, s + 1, sn - 1);
}

bool table_pattern_match(const char *pattern, const char *table)
{
	const char *pdot = strchr(pattern, '.');
	const char *tdot = strchr(table, '.');
	if (!pdot || !tdot || strcmp(pdot + 1, tdot + 1) != 0)
		return false;
	return glob_match(pattern, (size_t)(pdot - pattern), table,
			  (size_t)(tdot - table));
}
