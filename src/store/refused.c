/* SPDX-License-Identifier: MIT */
/*
 * Rows the current schema would refuse: old rows that break a CHECK added
 * NOT VALID since they were written (migration 004). Postgres checks such
 * a CHECK on every update that leaves a row pending, so one of them fails
 * the whole statement that touches it: a mark, a settle, a sweep. They
 * are failed alone, with the reason, and the statement runs again
 * (docs/design.md §10).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

/* The statement's LIMIT. */
#define REFUSED_BATCH 1000

int store_fail_refused(struct store *s, size_t *n, char *err, size_t errlen)
{
	*n = 0;
	for (;;) {
		int rc;
		PGresult *res = store_run(s, ST_FAIL_REFUSED, 0, NULL,
					  PGRES_TUPLES_OK, 0, &rc, err, errlen);
		if (!res)
			return store_public_rc(rc);
		size_t got = (size_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
		PQclear(res);
		*n += got;
		if (got < REFUSED_BATCH)
			break;
	}
	if (*n > 0) {
		char rows[24];
		snprintf(rows, sizeof(rows), "%zu", *n);
		log_fields(LOG_WARN,
			   "failed old rows the table's destination CHECK "
			   "refuses (control characters in exchange or "
			   "routing_key); last_error says which",
			   "rows", rows, NULL);
	}
	return 0;
}

bool store_fail_refused_after(struct store *s, const char *err)
{
	if (strncmp(err, "23514", 5) != 0)
		return false;
	char why[512];
	size_t n;
	if (store_fail_refused(s, &n, why, sizeof(why)) != 0) {
		log_fields(LOG_WARN, "could not fail the rows a CHECK refuses",
			   "error", why, NULL);
		return false;
	}
	/* Nothing failed: the CHECK that refused is another one, and the
	 * statement would fail the same way again. */
	return n > 0;
}
