/* SPDX-License-Identifier: MIT */
/*
 * Every SQL statement the relay runs against the outbox table, one
 * builder each. The shapes are those of docs/design.md §3, §4, §6 and §7,
 * each for a measured reason given there: read it before changing one.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guards.h"
#include "store_internal.h"

/* clang-format off */
const char *const store_stmt_names[ST_COUNT] = {
    "outbox_lease",	      "outbox_lease_bare",	"outbox_claim",
    "outbox_claim_renew",     "outbox_keepalive",	"outbox_sent",
    "outbox_sent_delete",     "outbox_retry",		"outbox_transport",
    "outbox_failed",	      "outbox_xact_status",	"outbox_sweep_claims",
    "outbox_settle_own",      "outbox_sweep",		"outbox_prune_claims",
    "outbox_clean_sent",      "outbox_clean_failed",
    "outbox_clean_sent_d",    "outbox_clean_failed_d",	"outbox_next_due",
    "outbox_redrive_f",	      "outbox_redrive_s",	"outbox_count_f",
    "outbox_count_s",	      "outbox_span_s",		"outbox_control",
    "outbox_redrive_check_s", "outbox_redrive_check_f", "outbox_unblock",
    "outbox_unblock_skip",    "outbox_unblock_redrive", "outbox_version",
    "outbox_redrive_recheck", "outbox_fail_refused",
    "outbox_claim_release",   "outbox_key_map",
};

const bool store_stmt_indexed[ST_COUNT] = {
    [ST_CLAIM] = true,         [ST_CLAIM_RENEW] = true,
    [ST_CLAIM_RELEASE] = true, [ST_SETTLE_OWN] = true,
    [ST_KEY_MAP] = true,
};
/* clang-format on */

/* What a mark returns for the ordered mode's tail. */
#define MARK_COLUMNS "t.id, t.partition_key, t.seq, t.status, t.last_error"
/* What a sweep's "done" CTE returns, for the ordered mode's tail. */
#define MARK_RETURNING " RETURNING " MARK_COLUMNS ") "

char *store_asprintf(const char *fmt, ...)
{
	char *out = NULL;
	va_list ap;
	va_start(ap, fmt);
	if (vasprintf(&out, fmt, ap) < 0)
		out = NULL;
	va_end(ap);
	return out;
}

/* The backoff of §3 after the attempt the mark charges (t.attempts + 1
 * attempts in all) as an SQL expression: the exponent is capped at 20 so
 * no attempt count overflows an interval, and each row gets +-20 % jitter
 * so a failed batch does not return as one. statement_timestamp(), not
 * now(): now() is when the lease transaction began. */
static char *backoff_sql(const struct store_options *o)
{
	return store_asprintf(
	    "statement_timestamp() + least(%lld::float8 * power(%.6f::float8, "
	    "least(greatest(t.attempts, 0), 20)), "
	    "%lld::float8) * (0.8 + 0.4 * random()) "
	    "* interval '1 millisecond'",
	    (long long)o->backoff_base_ms, o->backoff_factor,
	    (long long)o->backoff_max_ms);
}

/* What every mark records on the rows it concludes: the attempt it
 * charges and the lease for forensics ($2 lease id, $4 leased_by; now()
 * is the lease transaction's start); then pin_source(s, false). */
#define MARK_CHARGE                                                            \
	"attempts = t.attempts + 1, suspect = false, lease_id = $2::uuid, "    \
	"leased_by = $4, leased_at = now(), "
#define PIN(v)                                                                 \
	"relay_source = coalesce(t.relay_source, CASE WHEN t.source IS NULL "  \
	"THEN " v "::text END)"

/* The source an event went out with ($3, the relay's; v.source, a dead
 * claim's), pinned so a retry or a redrive carries the same source + id.
 * Where the producer left source NULL it goes into relay_source, behind
 * the payload, so a mark's new version on its old one's page (008) logs
 * the bytes from status on, not the payload (docs/design.md §11); into
 * source on a table made by hand without that column, as before 009. */
static const char *pin_source(const struct store *s, bool claim)
{
	if (s->relay_source_missing)
		return claim ? "source = coalesce(t.source, v.source)"
			     : "source = coalesce(t.source, $3)";
	return claim ? PIN("v.source") : PIN("$3");
}

/*
 * Ordered mode under block: a CTE appended to a mark whose "done" CTE
 * returns the rows it finished, recording the key of each row that
 * failed as blocked, in the same statement (store_block_tail). Nothing else
 * moves on a mark: a key's next row is its first live row once this one is
 * finished, and the key lock leases it (docs/design.md §6). Empty
 * otherwise (store_mark_has_tail).
 */
static char *order_tail(const struct store *s, bool may_fail)
{
	if (!store_mark_has_tail(s, may_fail))
		return strdup("");
	return store_block_tail(s, "d.status = 'failed'");
}

char *store_block_tail(const struct store *s, const char *failed)
{
	return store_asprintf(
	    ", blocked AS (INSERT INTO %1$s AS b (partition_key, blocking_id, "
	    "reason) SELECT DISTINCT ON (d.partition_key) d.partition_key, "
	    "d.id, d.last_error FROM done d WHERE d.partition_key IS NOT NULL "
	    "AND %3$s ORDER BY d.partition_key, d.seq ON CONFLICT "
	    "(partition_key) DO UPDATE SET blocking_id = excluded.blocking_id, "
	    "reason = excluded.reason WHERE coalesce((SELECT x.seq FROM %2$s x "
	    "WHERE x.id = excluded.blocking_id), -1) < coalesce((SELECT x.seq "
	    "FROM %2$s x WHERE x.id = b.blocking_id), -1) RETURNING 1) ",
	    s->blocked, s->table.quoted, failed);
}

bool store_mark_has_tail(const struct store *s, bool may_fail)
{
	return s->opt.ordered && s->opt.block_on_failure && may_fail;
}

/* On the claim session, autocommit ($6: this worker's previous claim, NULL
 * for its first), committed before any row of the batch is handed to the
 * broker. Each claim is a new row ($1: holder#xid, the lease transaction's
 * id, so the relay knows its name whatever becomes of the reply), and the
 * previous one is deleted in the same statement, but only once settled
 * (F1): emptied by the sweeper, or its transaction committed. A claim of a
 * lease that aborted and was not swept yet, or of a transaction still running
 * (a session lost half-open), makes the statement write nothing: deleting it
 * would lose the attempt it owes and let its rows out before the sweeper
 * made them suspects (lease.c settles it, then writes again). A new row
 * per claim, instead of one row per holder rewritten, is what lets a lease
 * read only the claims written since its claim floor (migration 006,
 * docs/design.md §4). Nor is a claim written once its lease transaction
 * ($3) is no longer in progress (LIVE): a claim that waited past its
 * reply's deadline for a pooler's server connection has had its lease
 * given up (lease.c). Its one row says which: whether the previous claim
 * was settled, and how many claims it wrote. */
static char *sql_claim(const struct store *s)
{
	return store_asprintf(
	    "WITH prev AS MATERIALIZED (SELECT " GUARD_CLAIM_NO_OVERWRITE
	    " AS settled FROM %s WHERE holder = $6), "
	    "ok AS MATERIALIZED (SELECT coalesce(bool_and(settled), true) AS "
	    "ok FROM prev), "
	    "gone AS (DELETE FROM %s WHERE holder = $6 AND (SELECT ok FROM "
	    "ok) RETURNING 1), "
	    "ins AS (INSERT INTO %s (holder, written_by, lease_id, xid, ids, "
	    "source, leased_at, expires_at) SELECT $1, pg_current_xact_id(), "
	    "$2::uuid, $3::xid8, $4::uuid[], $5, now(), "
	    "now() + %lld * interval '1 millisecond' WHERE (SELECT ok FROM ok) "
	    "AND " GUARD_CLAIM_LEASE_LIVE " AND (SELECT count(*) FROM gone) "
	    ">= 0 RETURNING 1) "
	    "SELECT (SELECT ok FROM ok), (SELECT count(*) FROM ins)",
	    CLAIM_XACT_STATUS("xid"), s->claims, s->claims, s->claims,
	    (long long)s->opt.lease_timeout_ms);
}

static char *sql_claim_renew(const struct store *s)
{
	return store_asprintf(
	    "UPDATE %s SET expires_at = now() + %lld * interval "
	    "'1 millisecond' WHERE holder = $1 AND lease_id = $2::uuid",
	    s->claims, (long long)s->opt.lease_timeout_ms);
}

/* On the claim session, autocommit: rows of the open lease that were never
 * handed to the broker leave its claim ($3; NULL: all of them) before the
 * lease ends, so no crash and no sweep charges them an attempt (a release
 * gives the attempt back, §3). Fenced by the lease id: a claim already
 * overwritten or settled is left alone. */
static char *sql_claim_release(const struct store *s)
{
	return store_asprintf(
	    "UPDATE %s SET ids = CASE WHEN $3::uuid[] IS NULL THEN "
	    "'{}'::uuid[] ELSE ARRAY(SELECT x FROM unnest(ids) AS x WHERE NOT "
	    "x = ANY($3::uuid[])) END WHERE holder = $1 AND lease_id = "
	    "$2::uuid AND cardinality(ids) > 0",
	    s->claims);
}

/* Inside the lease transaction: restarts the server's idle-in-transaction
 * clock, which is the lease's timeout. */
static char *sql_keepalive(const struct store *s)
{
	(void)s;
	return strdup("SELECT 1");
}

/*
 * Marks run inside the lease transaction, on rows it holds locked, so no
 * lease id fence is needed: a relay whose transaction ended can no longer
 * run them, and its COMMIT fails. They name the rows by ctid ($1), which a
 * locked row keeps until its lock goes, so each row costs a heap fetch and
 * no index descent, and by id (the last parameter), tested on the row the
 * ctid reached: a ctid names a row within one table only, and in a
 * partitioned table a row of another partition sits at the same ctid
 * (docs/design.md §11, "Rows named by ctid and id"). The ids' least
 * and greatest bound the id too (ROW_ID_RANGE): a prepared statement's
 * generic plan prunes no partition for id = ANY(array), but prunes, when
 * run, every partition outside a range whose ends are InitPlans, so a
 * mark of a batch written together reads the one partition it lies in.
 * The count of rows moved is the command's own. In
 * ordered mode under block the same statement records the keys of the
 * rows it failed, from the rows the mark returns; without a tail the
 * mark returns nothing. They test no status: a row this transaction holds is
 * pending (it was leased so, and only its holder can change it), and one
 * it already concluded has a new ctid (a later statement does not see the
 * old version). A status test let the planner prefer the pending index,
 * filtered by ctid, to the ctids themselves: under a held snapshot that
 * index is mostly dead entries, and 2 minutes into one a mark cost some
 * 80,000 buffer reads (docs/design.md §4, "A held snapshot").
 */
static char *mark_sql(char *core, const char *returning, char *tail)
{
	char *sql = NULL;
	if (core && tail)
		sql = tail[0] == '\0'
			  ? strdup(core)
			  : store_asprintf("WITH done AS (%s RETURNING %s) "
					   "%sSELECT count(*)::text FROM done",
					   core, returning, tail);
	free(core);
	free(tail);
	return sql;
}

static char *sql_sent(const struct store *s)
{
	return mark_sql(
	    store_asprintf(
		"UPDATE %s AS t SET status = 'sent', finished_at = "
		"statement_timestamp(), " MARK_CHARGE "%s WHERE t.ctid = "
		"ANY($1::tid[]) AND t.id = "
		"ANY($5::uuid[])" ROW_ID_RANGE("x", "unnest($5::uuid[]) AS x"),
		s->table.quoted, pin_source(s, false)),
	    MARK_COLUMNS, order_tail(s, false));
}

/* No history (OUTBOX_RETENTION=0): an acknowledged row is deleted, the
 * one write the floor of a table queue needs. */
static char *sql_sent_delete(const struct store *s)
{
	return mark_sql(store_asprintf("DELETE FROM %s AS t WHERE t.ctid = "
				       "ANY($1::tid[]) AND t.id = "
				       "ANY($2::uuid[])" ROW_ID_RANGE(
					   "x", "unnest($2::uuid[]) AS x"),
				       s->table.quoted),
			"t.id, t.partition_key, t.seq, 'sent'::text AS status, "
			"t.last_error",
			order_tail(s, false));
}

/* A mark that records a reason per row: $5, in the order of $1 and $6,
 * the rows' ids. */
#define MARK_REASONS                                                           \
	"FROM unnest($6::uuid[], $5::text[]) AS u(id, reason) WHERE t.ctid "   \
	"= ANY($1::tid[]) AND t.id = u.id" ROW_ID_RANGE(                       \
	    "x", "unnest($6::uuid[]) AS x")

/* Event class: failed once the attempts are spent. */
static char *sql_retry(const struct store *s)
{
	char *backoff = backoff_sql(&s->opt);
	char *core =
	    backoff ? store_asprintf(
			  "UPDATE %s AS t SET status = CASE WHEN t.attempts + "
			  "1 >= t.max_attempts THEN 'failed' ELSE 'pending' "
			  "END, finished_at = CASE WHEN t.attempts + 1 >= "
			  "t.max_attempts THEN statement_timestamp() END, "
			  "next_attempt_at = %s, last_error = "
			  "u.reason, " MARK_CHARGE "%s " MARK_REASONS,
			  s->table.quoted, backoff, pin_source(s, false))
		    : NULL;
	free(backoff);
	return mark_sql(core, MARK_COLUMNS, order_tail(s, true));
}

/* Transport class: the broker's fault, so never failed for it and never
 * blocks its key: there is no tail. */
static char *sql_transport(const struct store *s)
{
	char *backoff = backoff_sql(&s->opt);
	char *core =
	    backoff
		? store_asprintf("UPDATE %s AS t SET next_attempt_at = "
				 "%s, last_error = u.reason, " MARK_CHARGE
				 "%s " MARK_REASONS,
				 s->table.quoted, backoff, pin_source(s, false))
		: NULL;
	free(backoff);
	return mark_sql(core, MARK_COLUMNS, strdup(""));
}

static char *sql_failed(const struct store *s)
{
	return mark_sql(
	    store_asprintf(
		"UPDATE %s AS t SET status = 'failed', finished_at "
		"= statement_timestamp(), last_error = u.reason, " MARK_CHARGE
		"%s " MARK_REASONS,
		s->table.quoted, pin_source(s, false)),
	    MARK_COLUMNS, order_tail(s, true));
}

/* After a COMMIT whose reply was lost: did the lease transaction commit?
 * 'committed', 'aborted', 'in progress', or NULL when too old to say. An
 * id past the server's counter (the session came back to a restored copy
 * or another cluster) raises 22023 (mark.c). */
static char *sql_xact_status(const struct store *s)
{
	(void)s;
	return strdup("SELECT coalesce(pg_xact_status($1::xid8), 'unknown')");
}

/* The claims of lease transactions that aborted (a crashed, stalled or
 * disconnected worker): each of their rows still pending and not held by
 * another transaction is charged the attempt (a crash suspect, or failed
 * when attempts are spent), and the claim keeps only the rows it could
 * not charge because another transaction holds them now: a later sweep
 * charges those once they are free (or drops them, finished). Emptying
 * the claim of those too would let two relays take turns crashing on a
 * poison row without its attempts ever being charged (found by the
 * protocol's model, docs/model.md). Fenced by the lease id. A row named by
 * several dead claims (leases that died holding it one after the other)
 * is charged once per claim: each crash costs it an attempt, whether one
 * statement settles them or several; the newest claim names it, as the
 * worker's leased_by (its holder without the #xid of migration 006).
 * Rows are found by primary key: it plans as a lease transaction does
 * (ST_SETTLE_OWN by store_stmt_indexed, the sweeper's by PLANS_INDEXED:
 * no sequential scan, no sort), the victims in id order (the key's
 * order), and a claim's rows are checked
 * by a lookup of their status, not a condition the pending index's
 * predicate matches: Postgres otherwise read the whole pending index,
 * or the whole table, for a handful of ids, and under a held snapshot
 * those walk every entry it keeps (14,000 and 19,000 buffers a sweep 40 s
 * into one, history kept). */
static char *settle_claims_sql(const struct store *s, bool own)
{
	const char *T = s->table.quoted;
	char *tail = order_tail(s, true);
	char *sql =
	    tail
		? store_asprintf(
		      "WITH dead AS MATERIALIZED (SELECT holder, lease_id, "
		      "ids, source, leased_at FROM %s WHERE cardinality(ids) > "
		      "0 AND (%s = 'aborted' OR NOT %s)%s ORDER BY leased_at "
		      "LIMIT 100 FOR UPDATE SKIP LOCKED), "
		      "victims AS MATERIALIZED (SELECT t.id FROM %s t WHERE "
		      "t.id = ANY(ARRAY(SELECT unnest(ids) FROM dead)) AND "
		      "t.status = 'pending' ORDER BY t.id FOR NO KEY UPDATE "
		      "SKIP LOCKED), "
		      "done AS (UPDATE %s AS t SET "
		      "attempts = t.attempts + v.n, "
		      "status = CASE WHEN t.attempts + v.n >= t.max_attempts "
		      "THEN 'failed' ELSE 'pending' END, "
		      "finished_at = CASE WHEN t.attempts + v.n >= "
		      "t.max_attempts THEN now() END, suspect = t.attempts "
		      "+ v.n < t.max_attempts, "
		      "next_attempt_at = now() + random() * %lld * "
		      "interval '1 millisecond', "
		      "last_error = left('lease lost (leased_by ' || "
		      "v.holder || ')', %d), %s, lease_id = v.lease_id, "
		      "leased_by = "
		      "v.holder FROM (SELECT u.id, count(*)::int AS n, "
		      "(array_agg(regexp_replace(u.holder, '#[0-9]+$', '') "
		      "ORDER BY u.leased_at DESC))[1] AS holder, "
		      "(array_agg(u.lease_id ORDER BY u.leased_at "
		      "DESC))[1] AS lease_id, (array_agg(u.source ORDER BY "
		      "u.leased_at DESC))[1] AS source FROM (SELECT holder, "
		      "lease_id, source, leased_at, unnest(ids) AS id FROM "
		      "dead) u GROUP BY u.id) v WHERE t.id = "
		      "ANY(ARRAY(SELECT id FROM victims)) AND t.id = v.id%s%s, "
		      "emptied AS (UPDATE %s AS c SET ids = ARRAY(SELECT x "
		      "FROM unnest(c.ids) AS x WHERE NOT x IN (SELECT id FROM "
		      "victims) AND (SELECT k.status FROM %s k WHERE k.id = "
		      "x) = 'pending') FROM dead "
		      "d WHERE c.holder = d.holder AND c.lease_id = "
		      "d.lease_id RETURNING cardinality(c.ids) = 0 AS done) "
		      "SELECT (SELECT count(*) FILTER (WHERE done) FROM "
		      "emptied)::text, "
		      "count(*) FILTER (WHERE status = 'failed')::text, "
		      "count(*) FILTER (WHERE status <> 'failed')::text "
		      "FROM done",
		      s->claims, CLAIM_XACT_STATUS("xid"),
		      GUARD_SETTLE_ABORTED_ONLY ? "true" : "false",
		      own ? " AND holder = $1" : "", T, T,
		      (long long)s->opt.backoff_base_ms, STORE_ERROR_MAX,
		      pin_source(s, true), MARK_RETURNING, tail, s->claims, T)
		: NULL;
	free(tail);
	return sql;
}

static char *sql_sweep_claims(const struct store *s)
{
	return settle_claims_sql(s, false);
}

/* A worker settling its own dead claim before it writes the next one
 * (write_claim() in lease.c). */
static char *sql_settle_own(const struct store *s)
{
	return settle_claims_sql(s, true);
}

/* Claims of workers that stopped: emptied, or committed (or of a
 * transaction too old for its status to be kept), and a day old: an
 * aborted one still naming rows owes them their attempt, and stays until
 * a sweep has charged them (relays down for a day, a sweep stopped at its
 * row cap: pruned by age, they went uncharged);
 * and, at once, claims from another cluster or from before a restore
 * (CLAIM_XACT_STATUS): their transaction cannot be running here, and
 * their rows are whatever the copied table says, pending ones leased as
 * any other, with no attempt charged (docs/design.md §4). Those are
 * picked by the statement's snapshot and deleted only while their xid is
 * still the one seen: a claim rewritten meanwhile by a worker of this
 * cluster may carry an xid past that snapshot's horizon. The count of
 * those dropped is returned, for the log, and how much a later sweep may
 * find: claims naming rows whose lease transaction is still running or
 * aborted (one whose rows another transaction held when swept keeps
 * them, for a later sweep to charge: left out, the sweeper of many tables
 * skipped its table up to SWEEP_BACKSTOP_PASSES passes), and 1 while rows
 * of the row lease are in flight (struct sweep_result, open). */
static char *sql_prune_claims(const struct store *s)
{
	return store_asprintf(
	    "WITH old AS MATERIALIZED (SELECT holder, xid, xid >= %s AS "
	    "elsewhere FROM %s WHERE xid >= %s OR (leased_at < now() - "
	    "interval '1 day' AND (cardinality(ids) = 0 OR coalesce(%s, "
	    "'unknown') NOT IN ('in progress', 'aborted')))), "
	    "gone AS (DELETE FROM %s AS c USING old o WHERE c.holder = "
	    "o.holder AND c.xid = o.xid RETURNING o.elsewhere) "
	    "SELECT count(*) FILTER (WHERE elsewhere)::text, ((SELECT "
	    "count(*) FROM %s WHERE cardinality(ids) > 0 AND %s IN ('in "
	    "progress', 'aborted')) + (SELECT count(*) FROM (SELECT 1 FROM "
	    "%s WHERE "
	    "status = 'in_flight' LIMIT 1) f))::text FROM gone",
	    CLAIM_XACT_HORIZON, s->claims, CLAIM_XACT_HORIZON,
	    CLAIM_XACT_STATUS("xid"), s->claims, s->claims,
	    CLAIM_XACT_STATUS("xid"), s->table.quoted);
}

/* Rows left in_flight by relays of the row lease (before migration 003;
 * a rolling upgrade runs both): expired by the database clock, so
 * replicas with different settings never sweep each other early. Suspects
 * return with per-row jitter. lease_id stays for forensics. */
static char *sql_sweep(const struct store *s)
{
	const char *T = s->table.quoted;
	char *tail = order_tail(s, true);
	char *sql =
	    tail ? store_asprintf(
		       "WITH expired AS MATERIALIZED (SELECT id FROM %s "
		       "WHERE status = 'in_flight' AND lease_expires_at < "
		       "now() ORDER BY lease_expires_at LIMIT %d FOR NO KEY "
		       "UPDATE SKIP LOCKED), "
		       "done AS (UPDATE %s AS t SET "
		       "status = CASE WHEN t.attempts >= t.max_attempts "
		       "THEN 'failed' ELSE 'pending' END, "
		       "finished_at = CASE WHEN t.attempts >= "
		       "t.max_attempts THEN now() END, suspect = t.attempts "
		       "< t.max_attempts, "
		       "next_attempt_at = now() + random() * %lld * "
		       "interval '1 millisecond', "
		       "last_error = left('lease expired (leased_by ' || "
		       "coalesce(t.leased_by, 'unknown') || ')', %d) "
		       "WHERE t.id = ANY(ARRAY(SELECT id FROM expired)) AND "
		       "t.status = 'in_flight' AND t.lease_expires_at < "
		       "now()%s%s"
		       "SELECT status FROM done",
		       T, SWEEP_BATCH, T, (long long)s->opt.backoff_base_ms,
		       STORE_ERROR_MAX, MARK_RETURNING, tail)
		 : NULL;
	free(tail);
	return sql;
}

/* Keyset batches by finished_at: the cursor ($1) moves past what is gone
 * instead of rescanning the dead index edge each batch. Each batch must
 * read its rows in index order and stop at the limit; a plan that sorts
 * reads and sorts every expired row, each batch (1.5 s per batch with 2M
 * rows, against 50 ms). Two things led there: the blocking-row check
 * inside the limited scan (with a never-analyzed blocked-keys table it
 * became a hash anti join under a sort), so it applies to the scanned rows
 * instead; and a generic plan, which estimates the cursor..cutoff range at
 * 0.5 % of the table and sorts when that looks smaller than the batch, so
 * the cleaner's transaction plans for the values (begin_locked). The
 * cursor then comes from the scanned rows, and one past their last when
 * the batch deleted nothing, so a run of blocking rows with one timestamp
 * cannot hold it in place. */
static char *sql_clean_of(const struct store *s, const char *T,
			  const char *status)
{
	/* A failed row of a blocked key past its blocking row is kept too:
	 * it failed ahead of its turn, and the block moved down to an
	 * earlier failure (store_block_tail); the unblock of that one blocks
	 * the key at it again (redrive.c). */
	char *later = store_asprintf(
	    " AND " NOT_BLOCKED_BEFORE("s.partition_key", "s.seq"), s->blocked,
	    s->table.quoted);
	bool failed = strcmp(status, "failed") == 0;
	char *sql =
	    later
		? store_asprintf(
		      "WITH scanned AS MATERIALIZED (SELECT id, finished_at, "
		      "partition_key, seq FROM %s t WHERE status = '%s' AND "
		      "finished_at >= $1::timestamptz AND finished_at < now() "
		      "- $2::float8 * interval '1 millisecond' ORDER BY "
		      "finished_at LIMIT %d FOR UPDATE SKIP LOCKED), "
		      "gone AS (DELETE FROM %s AS t WHERE t.id = "
		      "ANY(ARRAY(SELECT s.id FROM scanned s WHERE NOT EXISTS "
		      "(SELECT 1 FROM %s b WHERE b.blocking_id = s.id)%s)) "
		      "RETURNING 1) "
		      "SELECT (SELECT count(*) FROM gone)::text, "
		      "count(*)::text, coalesce(max(finished_at)::text, ''), "
		      "coalesce((max(finished_at) + interval '1 "
		      "microsecond')::text, '') FROM scanned",
		      T, status, s->opt.clean_batch_size, T, s->blocked,
		      failed ? later : "")
		: NULL;
	free(later);
	return sql;
}

static char *sql_clean_sent(const struct store *s)
{
	return sql_clean_of(s, s->table.quoted, "sent");
}

static char *sql_clean_failed(const struct store *s)
{
	return sql_clean_of(s, s->table.quoted, "failed");
}

/* The same on a partitioned table's default partition alone: the daily
 * partitions' rows leave with them (partitions.c). */
static char *sql_clean_default(const struct store *s, const char *status)
{
	char d[160];
	table_derived(&s->table, "_default", d, sizeof(d));
	return sql_clean_of(s, d, status);
}

static char *sql_clean_sent_default(const struct store *s)
{
	return sql_clean_default(s, "sent");
}

static char *sql_clean_failed_default(const struct store *s)
{
	return sql_clean_default(s, "failed");
}

/* Rows not yet due as the lease began, $1 ms ago: those due before are
 * the lease's (or held back: a paused destination, a row another replica
 * holds) and must not shorten an idle worker's sleep; one that came due
 * since (a retry, a crash suspect) the lease could not see, and is due
 * now (0). A min() of the indexed column alone, read as the first entry
 * of the pending index from there: past every entry of a row leased when
 * it was due, which a held snapshot keeps (read from the lease's floor it
 * still read 73,000 to 88,000 buffers a call late in a 2-minute hold,
 * docs/benchmark.md, "A held snapshot"); a min() of an expression would
 * read every pending row after it. */
static char *sql_next_due(const struct store *s)
{
	return store_asprintf(
	    "SELECT coalesce(ceil(extract(epoch FROM (CASE WHEN m < now() "
	    "THEN now() ELSE m END - now())) * 1000)::bigint, -1)::text FROM "
	    "(SELECT min(next_attempt_at) AS m FROM %s WHERE status = "
	    "'pending' AND next_attempt_at > now() - $1::bigint * interval "
	    "'1 millisecond') AS x",
	    s->table.quoted);
}

static char *(*const builders[ST_COUNT])(const struct store *s) = {
    [ST_LEASE] = sql_lease,
    [ST_LEASE_BARE] = sql_lease_bare,
    [ST_CLAIM] = sql_claim,
    [ST_CLAIM_RENEW] = sql_claim_renew,
    [ST_KEEPALIVE] = sql_keepalive,
    [ST_SENT] = sql_sent,
    [ST_SENT_DELETE] = sql_sent_delete,
    [ST_RETRY] = sql_retry,
    [ST_TRANSPORT] = sql_transport,
    [ST_FAILED] = sql_failed,
    [ST_XACT_STATUS] = sql_xact_status,
    [ST_SWEEP_CLAIMS] = sql_sweep_claims,
    [ST_SETTLE_OWN] = sql_settle_own,
    [ST_SWEEP] = sql_sweep,
    [ST_PRUNE_CLAIMS] = sql_prune_claims,
    [ST_CLEAN_SENT] = sql_clean_sent,
    [ST_CLEAN_FAILED] = sql_clean_failed,
    [ST_CLEAN_SENT_DEFAULT] = sql_clean_sent_default,
    [ST_CLEAN_FAILED_DEFAULT] = sql_clean_failed_default,
    [ST_NEXT_DUE] = sql_next_due,
    [ST_REDRIVE_FAILED] = sql_redrive_failed,
    [ST_REDRIVE_SENT] = sql_redrive_sent,
    [ST_COUNT_FAILED] = sql_count_failed,
    [ST_COUNT_SENT] = sql_count_sent,
    [ST_SPAN_SENT] = sql_span_sent,
    [ST_CONTROL] = sql_control,
    [ST_REDRIVE_CHECK_SENT] = sql_redrive_check_sent,
    [ST_REDRIVE_CHECK_FAILED] = sql_redrive_check_failed,
    [ST_REDRIVE_RECHECK] = sql_redrive_recheck,
    [ST_FAIL_REFUSED] = sql_fail_refused,
    [ST_UNBLOCK] = sql_unblock,
    [ST_UNBLOCK_SKIP] = sql_unblock_skip,
    [ST_UNBLOCK_REDRIVE] = sql_unblock_redrive,
    [ST_VERSION] = sql_version,
    [ST_CLAIM_RELEASE] = sql_claim_release,
    [ST_KEY_MAP] = sql_key_map,
};

const char *store_sql(struct store *s, enum stmt st)
{
	if (st == ST_CONTROL && s->control_off)
		return STORE_NO_PAUSES_SQL;
	/* Built on first use: a store of the sweeper or the cleaner runs a
	 * few of them, and a relay of many tables has a store of each
	 * table in every thread (docs/design.md §13). */
	if (!s->sql[st]) {
		s->sql[st] = builders[st](s);
		if (s->sql[st])
			s->sql_hash[st] = store_text_hash(s->sql[st]);
	}
	return s->sql[st];
}

uint64_t store_sql_hash(struct store *s, enum stmt st)
{
	const char *sql = store_sql(s, st);
	if (sql != s->sql[st])
		return sql ? store_text_hash(sql) : 0;
	return s->sql_hash[st];
}
