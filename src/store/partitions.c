/* SPDX-License-Identifier: MIT */
/*
 * A partitioned table's partitions by the day (docs/design.md §11,
 * "Partitions by the day"): made ahead of the ids that will land in them,
 * and dropped once their day is past retention, the few rows the cleaner
 * would not delete yet carried to the default partition. The cleaner's thread
 * tends them on its own session, one replica at a time (the cleaner's advisory
 * lock), each step a short transaction of its own that waits for its locks at
 * most PARTITION_LOCK_TIMEOUT.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "locks.h"
#include "store_test.h"
#include "store_internal.h"

/* Longer than a producer's insert or a relay's lease takes to commit;
 * short enough that writers queued behind the DDL's lock barely notice.
 * A step that times out waits for the next round. */
#define PARTITION_LOCK_TIMEOUT "200ms"

/* The most rows a day's drop carries to the default partition: it
 * inserts them under the table's ACCESS EXCLUSIVE lock, which stops
 * every producer's insert meanwhile. A day with more
 * (a paused destination's backlog, a day's mass of failed rows kept for
 * their retention) is kept until fewer are left, and said so. */
#define CARRY_MAX_ROWS 10000

/* The carry's own bound under that lock, in case the count, read before
 * the lock, was passed since: producers wait no longer than this. */
#define CARRY_TIMEOUT "2s"

/* A validation of the days ahead's CHECK runs at most this many
 * statement timeouts: the cleaner's thread waits in it, and /healthz
 * reads a thread stuck after 25 of them (relay.c); one that needs more
 * (a default partition of hundreds of GB) leaves the days unmade, their
 * rows to the default partition, until the cleaner's deletes shrink it. */
#define VALIDATE_MAX_STATEMENTS 15

/* The partitions' days are UTC whatever the session's zone, so that
 * every replica names a partition alike. */
static const char tend_settings[] =
    "DO $$BEGIN PERFORM set_config('lock_timeout', '" PARTITION_LOCK_TIMEOUT
    "', true), set_config('TimeZone', 'UTC', true), "
    "set_config('client_min_messages', 'warning', true); END$$";

/* The days 1..$1 ahead without a partition named $2 || 'p' || day ($2:
 * the schema prefix and the table's name and "_"), each with the least
 * UUIDv7 of the day and of the next (48 bits of milliseconds, the rest
 * zero) and the milliseconds until the day begins. */
static const char sql_missing[] =
    "SELECT tag, substr(a, 1, 8) || '-' || substr(a, 9, 4) || "
    "'-0000-0000-000000000000', substr(b, 1, 8) || '-' || substr(b, 9, 4) "
    "|| '-0000-0000-000000000000', ms FROM (SELECT to_char(at, "
    "'YYYYMMDD') AS tag, lpad(to_hex((extract(epoch FROM at) * "
    "1000)::bigint), 12, '0') AS a, lpad(to_hex((extract(epoch FROM at + "
    "interval '1 day') * 1000)::bigint), 12, '0') AS b, (extract(epoch "
    "FROM at - now()) * 1000)::bigint AS ms FROM (SELECT "
    "date_trunc('day', now()) + g * interval '1 day' AS at FROM "
    "generate_series(1, $1::int) g) h) x WHERE to_regclass($2 || "
    "quote_ident($3 || tag)) IS NULL ORDER BY tag";

/* The table's daily partitions ($2: the name and "_p") whose day ended
 * more than $3 ms (retention) ago, oldest first. */
static const char sql_old[] =
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = "
    "i.inhrelid WHERE i.inhparent = to_regclass($1) AND left(c.relname, "
    "length($2)) = $2 AND substr(c.relname, length($2) + 1) ~ "
    "'^[0-9]{8}$' AND to_timestamp(substr(c.relname, length($2) + 1) "
    "|| '+00', 'YYYYMMDDTZH') + interval '1 day' < now() - $3::float8 * "
    "interval '1 millisecond' ORDER BY c.relname";

/* Ends a step whose statement failed with rc and err: a lock not had in
 * time is no error (*busy: the next round tries again); anything else
 * is. */
static int step_failed(struct store *s, int rc, bool *busy, char *err,
		       size_t errlen)
{
	char ignored[64];
	store_finish_tx(s, TX_ROLLBACK, ignored, sizeof(ignored));
	(void)errlen;
	if (strstr(err, "55P03")) {
		*busy = true;
		return 0;
	}
	return rc ? store_public_rc(rc) : STORE_ERROR;
}

/* One statement of a step, for its effect; as step_failed() on error. */
static int step(struct store *s, const char *sql, bool *busy, char *err,
		size_t errlen)
{
	int rc =
	    store_exec_cmd(s, "partitions", sql, 0, NULL, NULL, err, errlen);
	return rc == 0 ? 0 : step_failed(s, rc, busy, err, errlen);
}

/* BEGIN under the cleaner's lock with tend_settings. When another
 * session holds that lock (another replica's cleaner, or migrate
 * --partition, tending: it may make fewer days ahead than asked), *busy
 * is set and the transaction ended: the step is the next call's. */
static int begin(struct store *s, bool *busy, char *err, size_t errlen)
{
	bool got;
	int rc = store_begin_locked(s, LOCK_NS_CLEAN, PLANS_AS_SET, &got, err,
				    errlen);
	if (rc != 0)
		return rc;
	if (!got) {
		*busy = true;
		return store_finish_tx(s, TX_ROLLBACK, err, errlen);
	}
	bool timed_out = false;
	rc = step(s, tend_settings, &timed_out, err, errlen);
	return rc == 0 && timed_out ? STORE_ERROR : rc;
}

/* step() of sql built by store_asprintf(), NULL when out of memory;
 * frees it. */
static int step_built(struct store *s, char *sql, bool *busy, char *err,
		      size_t errlen)
{
	if (!sql) {
		snprintf(err, errlen, "partitions: out of memory");
		return step_failed(s, 0, busy, err, errlen);
	}
	int rc = step(s, sql, busy, err, errlen);
	free(sql);
	return rc;
}

/*
 * Whether the table is partitioned (*yes), and the storage parameters new
 * partitions take (into with, "" if none): the default partition's, but
 * a fill factor of 50 with history kept and none (100) without. A daily
 * partition's rows are each inserted once and, with history, rewritten
 * once to sent; at 50 every page keeps room for its rows' sent versions,
 * so each lands beside its row and logs only the bytes that changed, not
 * the whole row: a quarter less WAL an event than at the default
 * partition's 70 (docs/design.md §11, "Partitions by the day"). Without
 * history the rows are deleted in place and the room would only spread
 * them over more pages, which each lease's scan reads (migrate_room.c).
 */
static int shape(struct store *s, const char *dflt, bool history, bool *yes,
		 char *with, size_t withlen, char *err, size_t errlen)
{
	int rc;
	const char *values[3] = {s->table.quoted, dflt, history ? "t" : "f"};
	PGresult *res = store_exec(
	    s, "partitions",
	    "SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = "
	    "to_regclass($1)), false), (SELECT array_to_string(ARRAY(SELECT "
	    "o FROM unnest(reloptions) o WHERE o NOT LIKE 'fillfactor=%') || "
	    "CASE WHEN $3::boolean THEN "
	    "'{fillfactor=50}'::text[] ELSE '{}' END, ', ') FROM pg_class "
	    "WHERE oid = to_regclass($2))",
	    3, values, PGRES_TUPLES_OK, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	/* Partitioned otherwise than by migrate --partition: not ours. */
	*yes =
	    strcmp(PQgetvalue(res, 0, 0), "t") == 0 && !PQgetisnull(res, 0, 1);
	snprintf(with, withlen, "%s", PQgetvalue(res, 0, 1));
	PQclear(res);
	return 0;
}

int64_t store_validate_bound_ms(int64_t until_midnight_ms,
				int64_t statement_timeout_ms)
{
	int64_t ms = until_midnight_ms - 60000;
	int64_t most = VALIDATE_MAX_STATEMENTS * statement_timeout_ms;
	if (most > 0 && ms > most)
		ms = most;
	return ms < 1000 ? 1000 : ms > INT_MAX ? INT_MAX : ms;
}

/* Drops this round's CHECK of the days ahead from the default partition
 * when their partitions were not made: left there, it would refuse every
 * insert of those days once they come (their ids would have no partition
 * but the default). A few tries, each waiting at most a step's lock wait;
 * the cleaner's lock held elsewhere is tried again too: every clean batch
 * of any replica takes it, not only another replica's tending, and taken
 * for that, the CHECK was left in place without a word. When no try gets
 * the locks it says so, and the next round's check replaces it. */
static void drop_ahead(struct store *s, const char *dflt, const char *check)
{
	char err[512];
	char *sql = store_asprintf(
	    "ALTER TABLE %s DROP CONSTRAINT IF EXISTS %s", dflt, check);
	bool done = false;
	for (int i = 0; sql && !done && i < 5; i++) {
		bool busy = false;
		if (i > 0)
			clock_sleep_ms(100);
		if (s->ahead_drop_try)
			s->ahead_drop_try(s->ahead_drop_try_arg, i);
		if (begin(s, &busy, err, sizeof(err)) != 0)
			break;
		if (busy)
			continue;
		if (step(s, sql, &busy, err, sizeof(err)) != 0)
			break;
		done = !busy &&
		       store_finish_tx(s, TX_COMMIT, err, sizeof(err)) == 0;
	}
	free(sql);
	if (!done)
		log_warn("partitions of %s: the check of the days ahead on the "
			 "default partition could not be dropped; the next "
			 "round replaces it",
			 s->table.literal);
}

/* A row of the default partition has an id of the days ahead (a
 * producer's clock ahead, or a UUIDv4 that looks like one): the CHECK is
 * dropped and no partition made; an error that says so. */
static int refuse_ahead(struct store *s, const char *dflt, const char *check,
			char *err, size_t errlen)
{
	char why[512];
	snprintf(why, sizeof(why), "%s", err);
	drop_ahead(s, dflt, check);
	snprintf(err, errlen,
		 "partitions of %s: no partition made for the next days, "
		 "since the default partition holds a row with an id of "
		 "them (%s)",
		 s->table.literal, why);
	return STORE_ERROR;
}

/*
 * The days ahead without a partition get one each, behind a CHECK on
 * the default partition that none of its rows lies in them: added NOT
 * VALID (no scan), then validated (a scan under SHARE UPDATE EXCLUSIVE,
 * which no writer waits for), after which each creation is implied by
 * it and scans nothing (docs/design.md §11, measured 15 ms against 306
 * ms at 719 MB). The CHECK stays once the days are made (ids of days with
 * a partition never go to the default), and goes if they are not: left
 * behind a validation or a creation that did not end, it refused every
 * producer's insert of the next day from its midnight until the next
 * round (measured: a validation past the statement timeout on a large
 * default partition, each round).
 */
static int make_ahead(struct store *s, const char *dflt, const char *with,
		      int days, struct partition_result *r, char *err,
		      size_t errlen)
{
	char ahead[16], part_prefix[80], check[96];
	snprintf(ahead, sizeof(ahead), "%d", days);
	snprintf(part_prefix, sizeof(part_prefix), "%s_p", s->table.name);
	snprintf(check, sizeof(check), "\"%s_ahead\"", s->table.name);
	bool busy = false;
	int rc = begin(s, &busy, err, errlen);
	if (rc != 0 || busy) {
		r->busy |= busy;
		return rc;
	}
	const char *values[3] = {ahead, s->table.prefix, part_prefix};
	PGresult *res = store_exec(s, "partitions", sql_missing, 3, values,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	if (!res)
		return step_failed(s, rc, &busy, err, errlen);
	int n = PQntuples(res);
	if (n == 0) {
		PQclear(res);
		return store_finish_tx(s, TX_COMMIT, err, errlen);
	}
	rc = step_built(
	    s,
	    store_asprintf(
		"ALTER TABLE %s DROP CONSTRAINT IF EXISTS %s, ADD "
		"CONSTRAINT %s CHECK (id < '%s' OR id >= '%s') NOT VALID",
		dflt, check, check, PQgetvalue(res, 0, 1),
		PQgetvalue(res, n - 1, 2)),
	    &busy, err, errlen);
	if (rc == 0 && !busy)
		rc = store_finish_tx(s, TX_COMMIT, err, errlen);
	/* From here this round's check is on the default partition. */
	bool added = rc == 0 && !busy, refused = false;
	if (rc == 0 && !busy) {
		rc = begin(s, &busy, err, errlen);
		if (rc == 0 && !busy) {
			/* A scan of the whole default partition under a lock
			 * no writer waits for: not bounded by the statement
			 * timeout, which a large one outlasts, but by
			 * VALIDATE_MAX_STATEMENTS of them, and ended a minute
			 * before the first day's midnight, from which the
			 * CHECK would refuse every insert of that day until
			 * its partition is made: the CHECK is dropped then,
			 * and the next round tries again (a round in that
			 * last minute validates for a second). */
			char bound[64];
			int64_t ms = store_validate_bound_ms(
			    strtoll(PQgetvalue(res, 0, 3), NULL, 10),
			    s->opt.statement_timeout_ms);
			snprintf(bound, sizeof(bound),
				 "SET LOCAL statement_timeout = %lld",
				 (long long)ms);
			rc = step(s, bound, &busy, err, errlen);
			if (rc == 0 && !busy)
				rc = step_built(
				    s,
				    store_asprintf("ALTER TABLE %s VALIDATE "
						   "CONSTRAINT %s",
						   dflt, check),
				    &busy, err, errlen);
			if (rc == 0 && !busy)
				rc = store_finish_tx(s, TX_COMMIT, err, errlen);
			else if (rc != 0 && strstr(err, "23514")) {
				rc = refuse_ahead(s, dflt, check, err, errlen);
				refused = true;
			}
		}
	}
	if (rc == 0 && !busy) {
		rc = begin(s, &busy, err, errlen);
		for (int i = 0; rc == 0 && !busy && i < n; i++) {
			rc = step_built(
			    s,
			    store_asprintf(
				"CREATE TABLE IF NOT EXISTS %s\"%s%s\" "
				"PARTITION OF %s FOR VALUES FROM ('%s') TO "
				"('%s')%s%s%s",
				s->table.prefix, part_prefix,
				PQgetvalue(res, i, 0), s->table.quoted,
				PQgetvalue(res, i, 1), PQgetvalue(res, i, 2),
				with[0] ? " WITH (" : "", with,
				with[0] ? ")" : ""),
			    &busy, err, errlen);
		}
		if (rc == 0 && !busy) {
			rc = store_finish_tx(s, TX_COMMIT, err, errlen);
			if (rc == 0)
				r->created += (size_t)n;
		}
	}
	if (added && !refused && (rc != 0 || busy))
		drop_ahead(s, dflt, check);
	PQclear(res);
	r->busy |= busy;
	return rc;
}

/* Counts, before drop_day() takes its locks, the rows of day part that a
 * drop would carry (count: the statement); more than CARRY_MAX_ROWS keep
 * the day: said in a warning, *kept set and the transaction ended. A lock
 * not had in time ends it too, *busy set, as step() does. */
static int count_kept(struct store *s, const char *part, const char *count,
		      const char *const *retentions, bool *kept, bool *busy,
		      char *err, size_t errlen)
{
	int rc;
	PGresult *res = store_exec(s, "partitions", count, 2, retentions,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	if (!res)
		return step_failed(s, store_public_rc(rc), busy, err, errlen);
	long long n = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
	PQclear(res);
	if (n <= CARRY_MAX_ROWS)
		return 0;
	log_warn("partitions of %s: %s kept past retention; more than %d of "
		 "its rows are not done (pending, failed and kept, or "
		 "blocking a key), too many to carry to the default partition "
		 "under the table's lock; it is dropped once fewer are left",
		 s->table.literal, part, CARRY_MAX_ROWS);
	*kept = true;
	return store_finish_tx(s, TX_ROLLBACK, err, errlen);
}

/*
 * Drops the daily partition named part (bare), whose day ended more than
 * retention ago, carrying to the default partition first every row in it
 * that the cleaner would not delete now: pending or in flight (a retry in
 * backoff), sent within retention (a late retry), failed and kept, or
 * blocking a key. Without those few the partition would stay until its
 * last such row is done (a failed row kept a week would keep its day,
 * and every day would soon be kept). Under the table's and the
 * partition's ACCESS EXCLUSIVE locks, so no insert (a producer's own id of
 * that day, however late), lease or redrive comes between: detached, the
 * day's ids have no partition but the default, where the rows go with
 * their id and seq.
 */
static int drop_day(struct store *s, const char *part,
		    const char *const *retentions, struct partition_result *r,
		    char *err, size_t errlen)
{
	char p[160];
	snprintf(p, sizeof(p), "%s\"%s\"", s->table.prefix, part);
	bool busy = false;
	int rc = begin(s, &busy, err, errlen);
	if (rc != 0 || busy) {
		r->busy |= busy;
		return rc;
	}
	/* Listed before the cleaner's lock was taken: another replica may
	 * have dropped the day since, and its LOCK TABLE would fail the
	 * rest of this round. Under the lock none can drop it now. */
	const char *exists[1] = {p};
	PGresult *there =
	    store_exec(s, "partitions", "SELECT to_regclass($1) IS NOT NULL", 1,
		       exists, PGRES_TUPLES_OK, &rc, err, errlen);
	if (!there) {
		rc = step_failed(s, store_public_rc(rc), &busy, err, errlen);
		r->busy |= busy;
		return rc;
	}
	bool gone = strcmp(PQgetvalue(there, 0, 0), "t") != 0;
	PQclear(there);
	if (gone)
		return store_finish_tx(s, TX_ROLLBACK, err, errlen);
	const char *T = s->table.quoted;
	char *lock = store_asprintf(
	    "LOCK TABLE ONLY %s, %s IN ACCESS EXCLUSIVE MODE", T, p);
	char *detach =
	    store_asprintf("ALTER TABLE %s DETACH PARTITION %s", T, p);
	char *keep = store_asprintf(
	    "WITH keep AS (SELECT id FROM %s WHERE status = 'pending' UNION "
	    "SELECT id FROM %s WHERE status = 'in_flight' UNION SELECT id FROM "
	    "%s WHERE status = 'sent' AND finished_at >= now() - $1::float8 * "
	    "interval '1 millisecond' UNION SELECT id FROM %s WHERE status = "
	    "'failed' AND ($2::float8 <= 0 OR finished_at >= now() - "
	    "$2::float8 * interval '1 millisecond') UNION SELECT blocking_id "
	    "FROM %s UNION SELECT f.id FROM %s f JOIN %s b ON b.partition_key "
	    "= f.partition_key WHERE f.status = 'failed' AND f.seq > "
	    "coalesce((SELECT y.seq FROM %s y WHERE y.id = b.blocking_id), "
	    "-1))",
	    p, p, p, p, s->blocked, p, s->blocked, T);
	/* Of the day's rows alone, as the carry: keep names blocking rows
	 * of every day. */
	char *count = store_asprintf(
	    "%s SELECT count(*) FROM (SELECT 1 FROM %s x WHERE x.id IN "
	    "(SELECT id FROM keep) LIMIT %d) k",
	    keep, p, CARRY_MAX_ROWS + 1);
	char *carry = store_asprintf(
	    "%s INSERT INTO %s OVERRIDING SYSTEM VALUE SELECT x.* FROM %s x "
	    "WHERE x.id IN (SELECT id FROM keep)",
	    keep, T, p);
	char *drop = store_asprintf("DROP TABLE %s", p);
	size_t carried = 0;
	if (!lock || !detach || !keep || !count || !carry || !drop) {
		snprintf(err, errlen, "partitions: out of memory");
		rc = step_failed(s, 0, &busy, err, errlen);
		goto out;
	}
	bool kept = false;
	rc = count_kept(s, part, count, retentions, &kept, &busy, err, errlen);
	if (kept) {
		r->kept++;
		goto out;
	}
	if (rc == 0 && !busy)
		rc = step(s, lock, &busy, err, errlen);
	if (rc == 0 && !busy)
		rc = step(s, detach, &busy, err, errlen);
	if (rc == 0 && !busy)
		rc =
		    step(s, "SET LOCAL statement_timeout = '" CARRY_TIMEOUT "'",
			 &busy, err, errlen);
	if (rc == 0 && !busy) {
		rc = store_exec_cmd(s, "partitions", carry, 2, retentions,
				    &carried, err, errlen);
		if (rc != 0 && strstr(err, "57014")) {
			/* More to carry than the count said: the day waits,
			 * and the producers no longer. */
			log_warn("partitions of %s: %s kept past retention; "
				 "its rows to carry outlasted %s",
				 s->table.literal, part, CARRY_TIMEOUT);
			rc = store_finish_tx(s, TX_ROLLBACK, err, errlen);
			r->kept++;
			busy = true;
		} else if (rc != 0) {
			rc = step_failed(s, rc, &busy, err, errlen);
		}
	}
	if (rc == 0 && !busy)
		rc = step(s, drop, &busy, err, errlen);
	if (rc == 0 && !busy) {
		rc = store_finish_tx(s, TX_COMMIT, err, errlen);
		if (rc == 0) {
			r->dropped++;
			r->carried += carried;
		}
	}
out:
	r->busy |= busy;
	free(lock);
	free(detach);
	free(keep);
	free(count);
	free(carry);
	free(drop);
	return rc;
}

int store_partitions_tend(struct store *s, int days_ahead, int64_t retention_ms,
			  int64_t failed_retention_ms,
			  struct partition_result *r, char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	char dflt[160], with[512];
	table_derived(&s->table, "_default", dflt, sizeof(dflt));
	int rc = shape(s, dflt, retention_ms > 0, &r->partitioned, with,
		       sizeof(with), err, errlen);
	if (rc != 0)
		return rc;
	/* Rows of the daily partitions leave with them: the cleaner's
	 * deletes are for the default partition's. */
	s->clean_default = r->partitioned;
	if (!r->partitioned)
		return 0;
	/* The days past retention go whatever the days ahead did: a day
	 * not made (a producer's id of it in the default partition) must
	 * not keep every old day's rows. The first error is the one told. */
	int made = make_ahead(s, dflt, with, days_ahead, r, err, errlen);
	char made_err[1024] = "";
	if (made != 0)
		snprintf(made_err, sizeof(made_err), "%s", err);

	/* A day's sent rows are deletable once it ended more than
	 * retention ago; what is not then goes to the default. */
	char part_prefix[80], ret[32], fret[32];
	snprintf(part_prefix, sizeof(part_prefix), "%s_p", s->table.name);
	snprintf(ret, sizeof(ret), "%lld", (long long)retention_ms);
	snprintf(fret, sizeof(fret), "%lld", (long long)failed_retention_ms);
	const char *values[3] = {s->table.quoted, part_prefix, ret};
	PGresult *res = store_exec(s, "partitions", sql_old, 3, values,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	if (res) {
		const char *retentions[2] = {ret, fret};
		if (s->partitions_listed)
			s->partitions_listed(s->partitions_listed_arg);
		/* A lock not had in time ends the round's drops: each
		 * try queues every writer behind its request. */
		bool made_busy = r->busy;
		r->busy = false;
		for (int i = 0; rc == 0 && !r->busy && i < PQntuples(res); i++)
			rc = drop_day(s, PQgetvalue(res, i, 0), retentions, r,
				      err, errlen);
		r->busy |= made_busy;
		PQclear(res);
	} else {
		rc = store_public_rc(rc);
	}
	if (made != 0) {
		snprintf(err, errlen, "%s", made_err);
		return made;
	}
	return rc;
}
