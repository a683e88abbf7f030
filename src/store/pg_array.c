/* SPDX-License-Identifier: MIT */
/*
 * Postgres array literals of the store's statements' parameters
 * (store_pg_array()).
 */
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

/* Appends to a growable buffer; returns -1 when out of memory. */
struct buf {
	char *p;
	size_t len, cap;
};

static int buf_put(struct buf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->len + n + 1) * 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return -1;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

/* "v" with " and \ escaped, cut to max_item bytes on a UTF-8 boundary. */
static int buf_put_quoted(struct buf *b, const char *v, size_t max_item)
{
	size_t len = strlen(v);
	if (len > max_item) {
		len = max_item;
		while (len > 0 && ((unsigned char)v[len] & 0xC0) == 0x80)
			len--;
	}
	int rc = buf_put(b, "\"", 1);
	for (size_t j = 0; j < len && rc == 0; j++) {
		if (v[j] == '"' || v[j] == '\\')
			rc |= buf_put(b, "\\", 1);
		rc |= buf_put(b, v + j, 1);
	}
	rc |= buf_put(b, "\"", 1);
	return rc;
}

char *store_pg_array(const char *const *items, size_t n,
		     enum pg_array_form form, size_t max_item)
{
	struct buf b = {0};
	int rc = buf_put(&b, "{", 1);
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (i > 0)
			rc = buf_put(&b, ",", 1);
		if (form == PG_ARRAY_QUOTED)
			rc |= buf_put_quoted(&b, items[i] ? items[i] : "",
					     max_item);
		else
			rc |= buf_put(&b, items[i], strlen(items[i]));
	}
	if (rc == 0)
		rc = buf_put(&b, "}", 1);
	if (rc != 0) {
		free(b.p);
		return NULL;
	}
	return b.p;
}
