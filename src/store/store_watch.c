/* SPDX-License-Identifier: MIT */
/*
 * The numbers of `outbox-relay status --watch`: one statement per redraw,
 * on the command's own session, whose counts each read a partial index of
 * their state, and which Postgres itself turns into JSON.
 */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>

#include "pgconn.h"
#include "store_admin.h"
#include "store_internal.h"

/* Rows finished within the window, each status an arm of its own: on a
 * partitioned table failed and sent rows have an index each (the B-tree
 * and the BRIN of migrate_terminal.c), which neither serves for both
 * statuses at once; on a plain table each arm reads its part of the
 * finished-rows index by (status, finished_at). */
static char *watch_sql(const struct store *s)
{
	const char *T = s->table.quoted;
	char claims[160];
	table_derived(&s->table, "_claims", claims, sizeof(claims));
	/* In flight: live lock leases (from the claims) and rows relays of
	 * the row lease left in_flight. */
	char *flight = admin_flight_sql(T, claims, !s->claims_missing);
	if (!flight)
		return NULL;
	char *sql = store_asprintf(
	    "WITH p AS (SELECT count(*) AS pending, count(*) FILTER (WHERE "
	    "next_attempt_at <= now()) AS due_now, count(*) FILTER (WHERE "
	    "attempts > 0 AND next_attempt_at > now()) AS retrying, count(*) "
	    "FILTER (WHERE suspect) AS crash_suspects, min(created_at) AS "
	    "oldest FROM %s WHERE status = 'pending'), "
	    "f AS (SELECT count(*) FILTER (WHERE status = 'sent') AS sent, "
	    "count(*) FILTER (WHERE status = 'failed' AND attempts < "
	    "max_attempts) AS permanent, count(*) FILTER (WHERE status = "
	    "'failed' AND attempts >= max_attempts) AS attempts_spent FROM %s "
	    "WHERE finished_at > now() - $1::float8 * interval '1 "
	    "millisecond' AND (status = 'sent' OR status = 'failed')), "
	    "h AS (SELECT %s AS holder, count(*) AS rows, count(*) FILTER "
	    "(WHERE lease_expires_at < now()) AS expired FROM (%s) f0 GROUP BY "
	    "1) "
	    "SELECT json_build_object('at', extract(epoch FROM now()), "
	    "'window_seconds', $1::float8 / 1000, 'pending', p.pending, "
	    "'due_now', p.due_now, 'retrying', p.retrying, 'crash_suspects', "
	    "p.crash_suspects, 'oldest_pending_age_seconds', "
	    "coalesce(greatest(0, extract(epoch FROM now() - p.oldest)), 0), "
	    "'sent', f.sent, 'failed_permanent', f.permanent, "
	    "'failed_attempts_spent', f.attempts_spent, 'failed_total', "
	    "(SELECT count(*) FROM %s WHERE status = 'failed'), 'in_flight', "
	    "(SELECT coalesce(sum(h.rows), 0) FROM h), 'in_flight_by_holder', "
	    "(SELECT coalesce(json_agg(x ORDER BY x.rows DESC, x.holder), "
	    "'[]') FROM (SELECT * FROM h ORDER BY rows DESC, holder LIMIT 20) "
	    "x))::text FROM p, f",
	    T, T, ADMIN_HOLDER, flight, T);
	free(flight);
	return sql;
}

int store_admin_watch(struct store *s, int64_t window_ms, cJSON **out,
		      char *err, size_t errlen)
{
	int rc;
	char window[32];
	const char *values[1] = {window};
	char *sql = watch_sql(s);
	*out = NULL;
	snprintf(window, sizeof(window), "%lld", (long long)window_ms);
	PGresult *res = store_exec(s, "watch", sql, 1, values, PGRES_TUPLES_OK,
				   &rc, err, errlen);
	free(sql);
	if (!res)
		return store_public_rc(rc);
	*out = cJSON_Parse(PQgetvalue(res, 0, 0));
	PQclear(res);
	if (!*out) {
		snprintf(err, errlen, "watch: out of memory");
		return STORE_ERROR;
	}
	return 0;
}
