/* SPDX-License-Identifier: MIT */
/*
 * Operator statements of the store: registry, gauges, status, pauses.
 * Nothing here runs on a worker's session or on the hot path.
 */
#include "store.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgconn.h"
#include "store_admin.h"
#include "store_internal.h"

void admin_names_of(const struct outbox_table *t, struct names *n)
{
	table_derived(t, "_replicas", n->registry, sizeof(n->registry));
	table_derived(t, "_control", n->control, sizeof(n->control));
	table_derived(t, "_blocked_keys", n->blocked, sizeof(n->blocked));
	table_derived(t, "_claims", n->claims, sizeof(n->claims));
}

/* The SQL condition of a registry row seen alive: within
 * STORE_ADMIN_DEAD_AFTER_S. */
static void live_where(char *out, size_t outlen)
{
	snprintf(out, outlen,
		 "last_seen_at > now() - make_interval(secs => %d)",
		 STORE_ADMIN_DEAD_AFTER_S);
}

/* The shorter of two failed retentions, 0 (kept for good) the longest. */
static int64_t shorter_failed(int64_t a, int64_t b)
{
	return a <= 0 ? b : b <= 0 ? a : a < b ? a : b;
}

/* One retention the registry gave: value, by whom ("this command" when
 * the command's own). */
struct kept_one {
	int64_t ms;
	char by[72];
};

/* The command's own where shorter than k (beside relays that record
 * none, older than migration 013, or for a redrive's check); failed
 * retentions compared with 0 as the longest. */
static void own_if_shorter(struct kept_one *k, int64_t own, bool failed)
{
	bool shorter = failed
			   ? shorter_failed(k->ms, own) == own && own != k->ms
			   : own < k->ms;
	if (own >= 0 && shorter) {
		k->ms = own;
		snprintf(k->by, sizeof(k->by), "this command");
	}
}

/*
 * Each relay's cleaner deletes rows past its own retention (recorded at
 * every heartbeat, migration 013), and an operator's shell rarely carries
 * the deployment's settings: its default day beside relays without
 * history let an ordered redrive through past a later row deleted.
 * STORE_KEPT_SINCE (the redrive's question: since when may a row have
 * been deleted?) counts every relay in the registry, a crashed one's
 * retention grown by the time since its last heartbeat (it deleted by it
 * until then; a day's silence prunes it), and the command's own where
 * shorter, as one that stopped cleanly left the registry. STORE_KEPT_LIVE
 * (what the running relays keep, which a drop must not cut) counts the
 * relays seen within STORE_ADMIN_DEAD_AFTER_S.
 */
struct store_kept store_admin_kept(struct store *s, struct store_kept own,
				   enum store_kept_for asked)
{
	char registry[160], why[256];
	table_derived(&s->table, "_replicas", registry, sizeof(registry));
	char live[96], w[96] = "true", age[192] = "0";
	live_where(live, sizeof(live));
	/* A live relay deletes by its retention now: no silence to add. */
	if (asked == STORE_KEPT_LIVE)
		snprintf(w, sizeof(w), "%s", live);
	else
		snprintf(age, sizeof(age),
			 "CASE WHEN %s THEN 0 ELSE (extract(epoch FROM now() - "
			 "last_seen_at) * 1000)::bigint END",
			 live);
	char *sql = store_asprintf(
	    "SELECT count(*), count(retention_ms), min(retention_ms + a), "
	    "(array_agg(id ORDER BY retention_ms + a, id) FILTER (WHERE "
	    "retention_ms IS NOT NULL))[1], count(*) - count(retention_ms), "
	    "count(failed_retention_ms), min(failed_retention_ms + a) FILTER "
	    "(WHERE failed_retention_ms > 0), (array_agg(id ORDER BY "
	    "failed_retention_ms + a, id) FILTER (WHERE failed_retention_ms > "
	    "0))[1], count(*) - count(failed_retention_ms) FROM (SELECT id, "
	    "retention_ms, failed_retention_ms, %s AS a FROM %s WHERE %s) r",
	    age, registry, w);
	bool built = sql != NULL;
	int rc = STORE_ERROR;
	PGresult *res = built
			    ? store_exec(s, NULL, sql, 0, NULL, PGRES_TUPLES_OK,
					 &rc, why, sizeof(why))
			    : NULL;
	free(sql);
	bool failed_asked = own.failed_ms >= 0;
	const char *settings = failed_asked ? "OUTBOX_RETENTION and "
					      "OUTBOX_FAILED_RETENTION"
					    : "OUTBOX_RETENTION";
	if (!res) {
		/* A table made by hand may have no registry: nothing to
		 * read, and nothing to say. */
		if (!built || !store_err_undefined_table(why))
			log_fields(LOG_WARN,
				   "the relays' retention could not be read "
				   "from the registry: this command's own is "
				   "used",
				   "settings", settings, "error",
				   built ? why : "out of memory", NULL);
		return own;
	}
	long relays = strtol(PQgetvalue(res, 0, 0), NULL, 10);
	long recorded = strtol(PQgetvalue(res, 0, 1), NULL, 10);
	if (recorded == 0) {
		log_fields(LOG_WARN,
			   relays == 0
			       ? (asked == STORE_KEPT_LIVE
				      ? "no relay runs on this table: this "
					"command's own retention is used; "
					"give it the relays'"
				      : "no relay is in this table's registry "
					"(those that ran stopped cleanly, or a "
					"day ago): this command's own "
					"retention is used; give it the "
					"relays'")
			       : "the relays in the registry are older than "
				 "migration 013's record of their retention: "
				 "this command's own is used; give it the "
				 "relays'",
			   "settings", settings, "registry", registry, NULL);
		PQclear(res);
		return own;
	}
	struct kept_one sent = {.ms = strtoll(PQgetvalue(res, 0, 2), NULL, 10)};
	snprintf(sent.by, sizeof(sent.by), "%s", PQgetvalue(res, 0, 3));
	/* A redrive's own counts where shorter all the same: a relay that
	 * stopped cleanly left the registry (store_admin_forget), and what
	 * it deleted by a shorter retention before then no row tells. */
	if (asked == STORE_KEPT_SINCE ||
	    strtol(PQgetvalue(res, 0, 4), NULL, 10) > 0)
		own_if_shorter(&sent, own.sent_ms, false);
	/* Failed rows: 0 (kept for good) unless a relay keeps them less;
	 * the command's own where none recorded one. */
	struct kept_one failed = {.ms = 0};
	if (!PQgetisnull(res, 0, 6)) {
		failed.ms = strtoll(PQgetvalue(res, 0, 6), NULL, 10);
		snprintf(failed.by, sizeof(failed.by), "%s",
			 PQgetvalue(res, 0, 7));
	} else {
		snprintf(failed.by, sizeof(failed.by), "%s",
			 strtol(PQgetvalue(res, 0, 5), NULL, 10) > 0
			     ? "every relay"
			     : "this command");
	}
	if (strtol(PQgetvalue(res, 0, 5), NULL, 10) == 0)
		failed.ms = own.failed_ms;
	else if (asked == STORE_KEPT_SINCE ||
		 strtol(PQgetvalue(res, 0, 8), NULL, 10) > 0)
		own_if_shorter(&failed, own.failed_ms, true);
	PQclear(res);

	struct store_kept kept = {.sent_ms = sent.ms,
				  .failed_ms = failed_asked ? failed.ms : -1};
	bool sent_differs = sent.ms != own.sent_ms;
	bool failed_differs = failed_asked && failed.ms != own.failed_ms;
	if (sent_differs || failed_differs) {
		bool less =
		    own.sent_ms < 0 || sent.ms < own.sent_ms ||
		    (failed_differs &&
		     shorter_failed(failed.ms, own.failed_ms) == failed.ms);
		char sent_ms[24], failed_ms[24];
		snprintf(sent_ms, sizeof(sent_ms), "%lld", (long long)sent.ms);
		snprintf(failed_ms, sizeof(failed_ms), "%lld",
			 (long long)failed.ms);
		const char *msg = less ? "the relays keep rows for less time "
					 "than this command's own settings "
					 "say: the command goes by theirs"
				       : "the relays keep rows longer than "
					 "this command's own settings say: "
					 "the command goes by theirs";
		enum log_level level = less ? LOG_WARN : LOG_INFO;
		if (failed_asked)
			log_fields(level, msg, "settings", settings,
				   "retention_ms", sent_ms, "retention_of",
				   sent.by, "failed_retention_ms", failed_ms,
				   "failed_retention_of", failed.by, NULL);
		else
			log_fields(level, msg, "settings", settings,
				   "retention_ms", sent_ms, "retention_of",
				   sent.by, NULL);
	}
	return kept;
}

/* Appends item to a comma-separated list in out. */
static void list_add(char *out, size_t outlen, const char *item)
{
	size_t used = strlen(out);
	if (used < outlen)
		snprintf(out + used, outlen - used, "%s%s", used ? ", " : "",
			 item);
}

void store_side_tables_describe(const struct store *s, unsigned present,
				char *tables, size_t tables_len, char *features,
				size_t features_len)
{
	const struct {
		unsigned bit;
		const char *suffix, *feature;
	} side[] = {
	    {STORE_SIDE_CONTROL, "_control",
	     "operator pauses (outbox-relay pause/resume)"},
	    {STORE_SIDE_REPLICAS, "_replicas",
	     "the replica registry (status REPLICAS, outbox_live_replicas "
	     "counts only this replica)"},
	    {STORE_SIDE_BLOCKED_KEYS, "_blocked_keys",
	     "blocked keys (OUTBOX_ORDERING_ON_FAILURE=block)"},
	    {STORE_SIDE_CLAIMS, "_claims",
	     "crash accounting (a relay that dies holding rows charges them "
	     "no attempt, so a row that crashes relays is never failed)"},
	    {STORE_COLUMN_WRITTEN_BY, ".written_by (column)",
	     "the late scan (a row committed late by a long transaction "
	     "waits for the next rescan)"},
	    {STORE_COLUMN_RELAY_SOURCE, ".relay_source (column)",
	     "the source pinned behind the payload (a mark logs the whole "
	     "row of an event whose source is NULL)"},
	};
	tables[0] = features[0] = '\0';
	for (size_t i = 0; i < sizeof(side) / sizeof(side[0]); i++) {
		if (present & side[i].bit)
			continue;
		char name[160];
		snprintf(name, sizeof(name), "%s%s%s%s", s->table.schema,
			 s->table.schema[0] ? "." : "", s->table.name,
			 side[i].suffix);
		list_add(tables, tables_len, name);
		list_add(features, features_len, side[i].feature);
	}
}

/* A side table may not exist (ordered mode's blocked keys; any of them
 * beside a table made by hand). A statement cannot name a table that
 * might be missing, so its count goes through query_to_xml(), which plans
 * the inner query only when the CASE reaches it. select_n and where are
 * SQL text inside a string literal: quotes doubled. */
static char *sum_if_present_sql(const char *table, const char *select_n,
				const char *where)
{
	return store_asprintf(
	    "CASE WHEN to_regclass('%s') IS NULL THEN 0::bigint ELSE "
	    "(xpath('/row/n/text()', query_to_xml('%s FROM ' || "
	    "to_regclass('%s')::text || ' WHERE %s', false, true, "
	    "'')))[1]::text::bigint END",
	    table, select_n, table, where);
}

static char *count_if_present_sql(const char *table, const char *where)
{
	return sum_if_present_sql(table, "SELECT count(*) AS n", where);
}

char *admin_blocked_count_sql(const struct names *n)
{
	return count_if_present_sql(n->blocked, "true");
}

/* Rows held by live lock leases (docs/design.md §4): the claims whose
 * transaction is in progress. Tables made by hand may have no claims. */
static char *claimed_count_sql(const struct names *n)
{
	return sum_if_present_sql(
	    n->claims, "SELECT coalesce(sum(cardinality(ids)), 0) AS n",
	    CLAIM_XACT_STATUS("xid") " = ''in progress''");
}

/* The xmin horizon and what it costs the lease, from the catalogs every
 * role may read (ADMIN_SESSION_HOLDS says which sessions count). Another
 * role's session shows its pid, application_name and xmin to anyone, its
 * xact_start only to pg_read_all_stats: without that grant its age in
 * seconds is unknown (NULL, reported as 0). A logical slot's catalog_xmin
 * holds back only the catalogs, so slots are ranked by xmin alone. Of
 * holders as old, the one holding by its transaction id comes first: a
 * snapshot taken while that transaction ran has it as its xmin, the
 * relay's own leases' included, and ranked by seconds alone (unknown
 * without the grant, so last) the relay named itself. The oldest of the
 * database's own holders, and the server's start time, are read beside
 * (see store_admin_horizon()). */
static int horizon_gauges(struct store *s, struct store_gauges *g, char *err,
			  size_t errlen)
{
	int rc;
	char idx[160];
	table_derived(&s->table, "_pending_idx", idx, sizeof(idx));
	char *sql = store_asprintf(
	    "WITH h AS (SELECT 'session' AS kind, a.pid, a.application_name "
	    "AS name, %s AS xmin_age, %s AS by_xid, extract(epoch FROM now() "
	    "- a.xact_start) AS age_s, a.datname IS NOT DISTINCT FROM "
	    "current_database() AS own FROM pg_stat_activity a WHERE %s "
	    "UNION ALL SELECT 'replication_slot', NULL, slot_name::text, "
	    "age(xmin), false, NULL, database IS NOT DISTINCT FROM "
	    "current_database() FROM pg_replication_slots WHERE xmin IS "
	    "NOT NULL "
	    "UNION ALL SELECT 'prepared_transaction', NULL, gid, "
	    "age(transaction), true, extract(epoch FROM now() - prepared), "
	    "database IS NOT DISTINCT FROM current_database() "
	    "FROM pg_prepared_xacts), "
	    "top AS (SELECT * FROM h ORDER BY xmin_age DESC, by_xid DESC, "
	    "age_s DESC NULLS LAST LIMIT 1), "
	    "otop AS (SELECT * FROM h WHERE own ORDER BY xmin_age DESC, "
	    "by_xid DESC, age_s DESC NULLS LAST LIMIT 1) "
	    "SELECT top.kind, coalesce(top.pid, 0), top.name, "
	    "coalesce(top.xmin_age, 0), greatest(0, coalesce((top.age_s * "
	    "1000)::bigint, 0)), "
	    "coalesce((SELECT max(xmin_age) FROM h WHERE kind = 'session'), "
	    "0), coalesce((SELECT max(xmin_age) FROM h WHERE kind = "
	    "'replication_slot'), 0), coalesce((SELECT max(xmin_age) FROM h "
	    "WHERE kind = 'prepared_transaction'), 0), "
	    "coalesce(i.scans, 0), coalesce(i.read, 0), coalesce(i.fetched, "
	    "0), coalesce(i.xscans, 0), coalesce(i.xread, 0), "
	    "coalesce(i.xfetched, 0), otop.kind, coalesce(otop.pid, 0), "
	    "otop.name, coalesce(otop.xmin_age, 0), greatest(0, "
	    "coalesce((otop.age_s * 1000)::bigint, 0)), "
	    "pg_postmaster_start_time()::text "
	    "FROM (SELECT 1) one LEFT JOIN top ON true LEFT JOIN otop ON true "
	    "CROSS JOIN (SELECT "
	    "sum(idx_scan) AS scans, sum(idx_tup_read) AS read, "
	    "sum(idx_tup_fetch) AS fetched, "
	    "sum(pg_stat_get_xact_numscans(indexrelid)) AS xscans, "
	    "sum(pg_stat_get_xact_tuples_returned(indexrelid)) AS xread, "
	    "sum(pg_stat_get_xact_tuples_fetched(indexrelid)) AS xfetched "
	    "FROM pg_stat_user_indexes WHERE indexrelid IN " ADMIN_STATS_OF(
		"to_regclass('%s')") ") i",
	    ADMIN_SESSION_XMIN_AGE, ADMIN_SESSION_BY_XID, ADMIN_SESSION_HOLDS,
	    idx, idx);
	PGresult *res = store_exec(s, "horizon query", sql, 0, NULL,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	free(sql);
	if (!res)
		return store_public_rc(rc);
	struct store_horizon *h = &g->horizon, *o = &g->own_horizon;
	snprintf(h->kind, sizeof(h->kind), "%s", PQgetvalue(res, 0, 0));
	/* A label, which must be valid UTF-8: a prepared transaction's
	 * gid is any text, of any database's encoding, passed as it is
	 * where the encodings match (the relay's session asks for UTF-8). */
	utf8_copy_valid(h->name, sizeof(h->name), PQgetvalue(res, 0, 2));
	snprintf(o->kind, sizeof(o->kind), "%s", PQgetvalue(res, 0, 14));
	utf8_copy_valid(o->name, sizeof(o->name), PQgetvalue(res, 0, 16));
	snprintf(g->server, sizeof(g->server), "%s", PQgetvalue(res, 0, 19));
	int64_t *fields[] = {&h->pid,
			     NULL,
			     &h->xmin_age,
			     &h->age_ms,
			     &g->xmin_age_sessions,
			     &g->xmin_age_slots,
			     &g->xmin_age_prepared,
			     &g->pending_idx_scans,
			     &g->pending_idx_read,
			     &g->pending_idx_fetched,
			     &g->own_idx_scans,
			     &g->own_idx_read,
			     &g->own_idx_fetched,
			     NULL,
			     &o->pid,
			     NULL,
			     &o->xmin_age,
			     &o->age_ms};
	for (int i = 0; i < (int)(sizeof(fields) / sizeof(fields[0])); i++)
		if (fields[i])
			*fields[i] =
			    PQgetisnull(res, 0, i + 1)
				? 0
				: strtoll(PQgetvalue(res, 0, i + 1), NULL, 10);
	PQclear(res);
	return 0;
}

/*
 * The backlog count's floors (docs/design.md §4, "A held snapshot"): the
 * count reads the pending index from the oldest next_attempt_at the
 * previous count found (gauge_floor), and the late scan's index for rows
 * below it written since that count's snapshot (gauge_written): under a
 * held snapshot the entries of every row finished since it was taken stay
 * at the head of the pending index, and a count from the start walks them
 * all. Every row pending when the previous count ran was at or above its
 * floor, and a row that count could not see has a writer at or above the
 * xmin of its snapshot, so the two reads miss only rows with no writer
 * put below the floor since; a count from the start, once per
 * OUTBOX_LEASE_RESCAN_INTERVAL or RESCAN_COST_FACTOR times its last
 * duration, counts those too. Without the written_by column every count
 * is from the start.
 */
static bool count_from_start(const struct store *s, int64_t now_ms)
{
	/* Floors of another session may be another server's (a restore,
	 * a switch-over): rows pending again below them went uncounted
	 * until the next count from the start. */
	return s->written_missing || !s->gauge_floor[0] ||
	       s->gauge_gen != s->ses->conn_gen ||
	       s->opt.lease_rescan_ms == 0 || now_ms >= s->gauge_full_at_ms;
}

/* What the pending count reads: the whole index, or from the floors. */
static char *pending_count_sql(const struct store *s, bool full)
{
	const char *T = s->table.quoted;
	if (full)
		return store_asprintf("SELECT created_at, next_attempt_at FROM "
				      "%s WHERE status = 'pending'",
				      T);
	return store_asprintf(
	    "SELECT created_at, next_attempt_at FROM %s WHERE status = "
	    "'pending' AND next_attempt_at >= '%s'::timestamptz UNION ALL "
	    "SELECT created_at, next_attempt_at FROM %s WHERE status = "
	    "'pending' AND written_by >= '%llu'::xid8 AND next_attempt_at < "
	    "'%s'::timestamptz",
	    T, s->gauge_floor, T, (unsigned long long)s->gauge_written,
	    s->gauge_floor);
}

/* Keeps the floors the count returned, if they are what they should be
 * (a time in UTC, written in ISO form whatever the session's DateStyle
 * and TimeZone, which behind a pooler another client's plain SET may have
 * changed on the next server connection: German style passed as July for
 * December there; a transaction id). An infinite time, or one before the
 * common era (which to_char writes without its era), has no text, and
 * the next count is from the start. */
static void keep_count_floors(struct store *s, const char *floor,
			      const char *written)
{
	size_t n = strlen(floor);
	bool ok = n > 0 && n < sizeof(s->gauge_floor) &&
		  strspn(floor, "0123456789-:+. ") == n && written[0] &&
		  strspn(written, "0123456789") == strlen(written);
	if (!ok) {
		s->gauge_floor[0] = '\0';
		return;
	}
	memcpy(s->gauge_floor, floor, n + 1);
	s->gauge_written = strtoull(written, NULL, 10);
	s->gauge_gen = s->ses->conn_gen;
}

/* Whether this connection's role was refused
 * pg_notification_queue_usage(). */
static bool notify_denied(const struct store *s)
{
	return s->notify_denied_gen == s->ses->conn_gen;
}

static int count_gauges(struct store *s, struct store_gauges *g, char *err,
			size_t errlen)
{
	struct names n;
	int rc;
	const char *T = s->table.quoted;
	admin_names_of(&s->table, &n);
	char *blocked = admin_blocked_count_sql(&n);
	char alive[96];
	live_where(alive, sizeof(alive));
	char *live = count_if_present_sql(n.registry, alive);
	char *claimed = claimed_count_sql(&n);
	int64_t started_ms = clock_ms();
	bool full = count_from_start(s, started_ms);
	char *pending = pending_count_sql(s, full);
	/* Each count is bounded by a partial index of its state; the pending
	 * scan also yields the oldest row's age, and the next floors: the
	 * oldest next_attempt_at counted (now() when none) and the xmin of
	 * the statement's snapshot. */
	char *sql =
	    blocked && live && claimed && pending
		? store_asprintf(
		      "WITH p AS (SELECT count(*) AS n, min(created_at) AS "
		      "oldest, min(next_attempt_at) AS low FROM (%s) x) "
		      "SELECT p.n, greatest(0, coalesce((extract(epoch FROM "
		      "now() - "
		      "p.oldest) * 1000)::bigint, 0)), "
		      "(SELECT count(*) FROM %s WHERE status = 'in_flight') "
		      "+ %s, "
		      "(SELECT count(*) FROM %s WHERE status = 'failed'), "
		      "coalesce((SELECT sum(pg_stat_get_dead_tuples(relid)) "
		      "FROM " ADMIN_STATS_OF(
			  "'%s'::regclass") " r), 0), "
					    "%s, %s, %s, "
					    "CASE WHEN p.low IS NULL OR p.low "
					    ">= '0001-01-01 00:00:00+00' "
					    "THEN to_char(least(coalesce("
					    "p.low, now()), now()) AT TIME "
					    "ZONE 'UTC', 'YYYY-MM-DD "
					    "HH24:MI:SS.US') || '+00' END, "
					    "pg_snapshot_xmin(pg_current_"
					    "snapshot())::text "
					    "FROM p",
		      pending, T, claimed, T, T, T, live, blocked,
		      notify_denied(s)
			  ? "NULL::bigint"
			  : "(pg_notification_queue_usage() * 1000000)::bigint")
		: NULL;
	PGresult *res = store_exec(s, "gauge query", sql, 0, NULL,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	free(sql);
	free(pending);
	free(blocked);
	free(live);
	free(claimed);
	if (!res)
		return store_public_rc(rc);
	int64_t *fields[8] = {&g->backlog,	&g->oldest_pending_ms,
			      &g->in_flight,	&g->failed,
			      &g->dead_tuples,	&g->live_replicas,
			      &g->blocked_keys, &g->notify_queue_ppm};
	for (int i = 0; i < 8; i++)
		*fields[i] = PQgetisnull(res, 0, i)
				 ? 0
				 : strtoll(PQgetvalue(res, 0, i), NULL, 10);
	if (PQgetisnull(res, 0, 7))
		g->notify_queue_ppm = -1;
	keep_count_floors(s, PQgetvalue(res, 0, 8), PQgetvalue(res, 0, 9));
	if (full) {
		int64_t ended_ms = clock_ms();
		s->gauge_full_at_ms =
		    store_rescan_due(s, ended_ms, ended_ms - started_ms);
	}
	PQclear(res);
	return 0;
}

int store_admin_horizon(struct store *s, struct store_gauges *g, char *err,
			size_t errlen)
{
	memset(g, 0, sizeof(*g));
	return horizon_gauges(s, g, err, errlen);
}

/* The counts and the horizon in one transaction, so the horizon query can
 * read what the counts cost the pending index (this transaction's own
 * statistics) and the lease's share be told apart from the gauges'. */
int store_admin_gauges(struct store *s, struct store_gauges *g, char *err,
		       size_t errlen)
{
	memset(g, 0, sizeof(*g));
	int rc = store_exec_cmd(s, "gauge query", PGCONN_BEGIN, 0, NULL, NULL,
				err, errlen);
	if (rc != 0)
		return rc;
	rc = count_gauges(s, g, err, errlen);
	if (rc != 0 && !notify_denied(s) &&
	    strcmp(s->ses->failed_state, "42501") == 0 &&
	    strstr(err, "pg_notification_queue_usage")) {
		/* Said once; the other gauges go on without it, as the
		 * listener does. */
		log_warn(
		    "this role may not run pg_notification_queue_usage() "
		    "(revoked from PUBLIC): outbox_notify_queue_usage_ratio "
		    "reads 0 for its database while the other gauges go on; "
		    "grant EXECUTE on it, and the next connection shows it");
		s->notify_denied_gen = s->ses->conn_gen;
		rc = store_exec_cmd(s, "gauge query", "ROLLBACK", 0, NULL, NULL,
				    err, errlen);
		if (rc == 0)
			rc = store_exec_cmd(s, "gauge query", PGCONN_BEGIN, 0,
					    NULL, NULL, err, errlen);
		if (rc == 0)
			rc = count_gauges(s, g, err, errlen);
	}
	if (rc == 0)
		rc = horizon_gauges(s, g, err, errlen);
	if (rc == STORE_RECONNECT)
		return rc;
	if (rc != 0) {
		char ignored[256];
		store_exec_cmd(s, "gauge query", "ROLLBACK", 0, NULL, NULL,
			       ignored, sizeof(ignored));
		return rc;
	}
	return store_exec_cmd(s, "gauge query", "COMMIT", 0, NULL, NULL, err,
			      errlen);
}

/* ---- pauses ---- */

/* Pauses need the control table; a table made by hand may lack it. */
static int need_control(struct store *s, const char *control, char *err,
			size_t errlen)
{
	unsigned present = 0;
	int rc = store_admin_side_tables(s, &present, err, errlen);
	if (rc == 0 && !(present & STORE_SIDE_CONTROL)) {
		snprintf(err, errlen,
			 "the control table %s does not exist, so no pause "
			 "can be kept: create it with `outbox-relay migrate`",
			 control);
		rc = STORE_ERROR;
	}
	return rc;
}

int store_admin_pause(struct store *s, const char *destination,
		      const char *reason, const char *paused_by,
		      bool *was_paused, char *err, size_t errlen)
{
	struct names n;
	int rc;
	admin_names_of(&s->table, &n);
	*was_paused = false;
	rc = need_control(s, n.control, err, errlen);
	if (rc != 0)
		return rc;
	/* A destination past the relays' STORE_MAX_PAUSES is not inserted:
	 * they would not read it, and its rows would go on being published.
	 * The count is taken under a lock that two pauses do not share (the
	 * relays' reads pass it), or each could see one room left. */
	char *sql = store_asprintf("LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE",
				   n.control);
	if (!sql) {
		snprintf(err, errlen, "pause: out of memory");
		return STORE_ERROR;
	}
	rc = store_exec_cmd(s, "pause", PGCONN_BEGIN, 0, NULL, NULL, err,
			    errlen);
	if (rc != 0) {
		free(sql);
		return rc;
	}
	rc = store_exec_cmd(s, "pause", sql, 0, NULL, NULL, err, errlen);
	free(sql);
	if (rc != 0)
		goto fail;
	/* xmax is set on the conflicting row an upsert updated and zero on
	 * a fresh insert: it tells the two apart in one statement. The
	 * first pause's paused_at is kept. */
	sql = store_asprintf(
	    "INSERT INTO %s AS c (destination, paused_by, reason) SELECT $1, "
	    "$2, $3 WHERE $1 = '*' OR EXISTS (SELECT 1 FROM %s WHERE "
	    "destination = $1) OR (SELECT count(*) FROM %s WHERE destination "
	    "<> '*') < %d ON CONFLICT (destination) DO UPDATE SET "
	    "paused_by = excluded.paused_by, reason = "
	    "coalesce(excluded.reason, c.reason) "
	    "RETURNING (c.xmax::text <> '0')",
	    n.control, n.control, n.control, STORE_MAX_PAUSES);
	if (!sql) {
		snprintf(err, errlen, "pause: out of memory");
		rc = STORE_ERROR;
		goto fail;
	}
	const char *values[3] = {destination, paused_by, reason};
	PGresult *res = store_exec(s, "pause", sql, 3, values, PGRES_TUPLES_OK,
				   &rc, err, errlen);
	free(sql);
	if (!res)
		goto fail;
	if (PQntuples(res) == 0) {
		PQclear(res);
		snprintf(err, errlen,
			 "pause: %d destinations are paused already, the most "
			 "a relay keeps; resume one first, or pause all "
			 "leasing (without --destination)",
			 STORE_MAX_PAUSES);
		rc = STORE_REFUSED;
		goto fail;
	}
	*was_paused = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	return store_finish_tx(s, TX_COMMIT, err, errlen);
fail : {
	char ignored[64];
	store_finish_tx(s, TX_ROLLBACK, ignored, sizeof(ignored));
	return store_public_rc(rc);
}
}

int store_admin_resume(struct store *s, const char *destination,
		       bool *was_paused, char *err, size_t errlen)
{
	struct names n;
	size_t rows = 0;
	admin_names_of(&s->table, &n);
	*was_paused = false;
	int rc = need_control(s, n.control, err, errlen);
	if (rc != 0)
		return rc;
	char *sql =
	    store_asprintf("DELETE FROM %s WHERE destination = $1", n.control);
	const char *values[1] = {destination};
	rc = store_exec_cmd(s, "resume", sql, 1, values, &rows, err, errlen);
	free(sql);
	if (rc == 0)
		*was_paused = rows > 0;
	return rc;
}

/* ---- time arguments ---- */

static bool is_duration(const char *s)
{
	const char *p = s;
	while (isdigit((unsigned char)*p))
		p++;
	if (p == s)
		return false;
	return strcmp(p, "ms") == 0 || strcmp(p, "s") == 0 ||
	       strcmp(p, "m") == 0 || strcmp(p, "h") == 0 ||
	       strcmp(p, "d") == 0;
}

int store_admin_time(struct store *s, const char *text, char *out,
		     size_t outlen, char *err, size_t errlen)
{
	const char *fmt = "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"'";
	char *sql =
	    is_duration(text)
		? store_asprintf("SELECT to_char((now() - $1::interval) "
				 "AT TIME ZONE 'UTC', %s)",
				 fmt)
		: store_asprintf("SELECT to_char($1::timestamptz AT "
				 "TIME ZONE 'UTC', %s)",
				 fmt);
	const char *values[1] = {text};
	int rc;
	PGresult *res = store_exec(s, "time", sql, 1, values, PGRES_TUPLES_OK,
				   &rc, err, errlen);
	free(sql);
	if (!res) {
		/* A data exception (class 22): the value itself is wrong. */
		if (strncmp(err, "time: 22", 8) == 0) {
			snprintf(err, errlen,
				 "'%s' is neither a time Postgres can read "
				 "nor a duration like 90s, 15m, 2h or 3d",
				 text);
			return STORE_INVALID;
		}
		return store_public_rc(rc);
	}
	/* to_char() of infinity (or of an interval that reaches it) is
	 * NULL: no instant a range can start or end at. */
	if (PQgetisnull(res, 0, 0)) {
		PQclear(res);
		snprintf(err, errlen,
			 "'%s' is not a finite time: give a date and time or "
			 "a duration like 90s, 15m, 2h or 3d",
			 text);
		return STORE_INVALID;
	}
	snprintf(out, outlen, "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	return 0;
}

char *admin_flight_sql(const char *T, const char *claims, bool has_claims)
{
	char *legacy = store_asprintf(
	    "SELECT id, type, exchange, leased_by, lease_id, leased_at, "
	    "lease_expires_at, attempts, max_attempts, seq FROM %s WHERE "
	    "status = 'in_flight'",
	    T);
	if (!has_claims || !legacy)
		return legacy;
	char *both = store_asprintf(
	    "SELECT t.id, t.type, t.exchange, regexp_replace(c.holder, "
	    "'#[0-9]+$', '') AS leased_by, "
	    "c.lease_id, c.leased_at, c.expires_at AS lease_expires_at, "
	    "t.attempts + 1 AS attempts, t.max_attempts, t.seq FROM %s c "
	    "CROSS JOIN LATERAL unnest(c.ids) AS u(id) JOIN %s t ON t.id = "
	    "u.id WHERE cardinality(c.ids) > 0 AND %s = "
	    "'in progress' AND t.status = 'pending' UNION ALL %s",
	    claims, T, CLAIM_XACT_STATUS("c.xid"), legacy);
	free(legacy);
	return both;
}
