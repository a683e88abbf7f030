/* SPDX-License-Identifier: MIT */
/*
 * Contract steps (`outbox-relay migrate --contract`): what only relays of
 * an older protocol need, dropped once none is left (docs/design.md §11,
 * "Contract steps wait for the relays' protocol"). Migrations expand; a
 * contract step is their other half, and runs only when asked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "migrate.h"
#include "pgconn.h"
#include "store_internal.h"
#include "store_test.h"

struct contract_step {
	const char *name;
	int protocol; /* what every relay left must speak */
	/* Outside a transaction; no write waits for its lock. */
	const char *sql;
	/* The same on a partitioned table, which Postgres allows no
	 * CONCURRENTLY on: its lock blocks writes, so it waits briefly and
	 * retries, as migrate's do. */
	const char *sql_partitioned;
	/* sql's own lock blocks writes too: waited for briefly, retried. */
	bool blocks_writes;
};

/* In the order they run; a step's statement is idempotent, so a step
 * recorded by a run that stopped before it is done again. */
static const struct contract_step contract_steps[] = {
    /* Fresh keyed rows waiting for the head marker's classification
     * (migration 002): relays of protocol 1 lease keys by a key lock and
     * classify nothing, yet every keyed insert writes an entry. */
    {"drop_unclassified_idx", 1,
     "DROP INDEX CONCURRENTLY IF EXISTS {{s}}\"{{n}}_unclassified_idx\"",
     "DROP INDEX IF EXISTS {{s}}\"{{n}}_unclassified_idx\"", false},
};

/*
 * The table made partitioned by range of id, the table itself its
 * DEFAULT partition (docs/design.md §11, "The migration"): a producer's
 * own UUIDv4 ids lie anywhere in the id space, so no range holds the old
 * rows. One statement, so one transaction: every lock it takes is held to
 * its end, and a refusal or failure leaves the table as it was. Nothing
 * is scanned or built (the new table's indexes are empty, ATTACH adopts
 * the old ones), so it holds the table's ACCESS EXCLUSIVE lock for tens
 * of milliseconds whatever the size. Relays of protocol 1 name rows by
 * ctid and id, which stays one row on a partitioned table; older ones by
 * bare ctid, which does not.
 */
static const char partition_sql[] =
    "DO $step$ DECLARE "
    "old regclass := to_regclass('{{table}}'); nsp text; owner regrole; "
    "dflt text := '{{n}}_default'; r record; renamed text; def text; "
    "indexes int; why text; seq text; next bigint; called boolean; "
    "BEGIN "
    "IF old IS NULL THEN RAISE EXCEPTION 'table % does not exist', "
    "{{lit}}; END IF; "
    /* Done before: the step is idempotent. */
    "IF (SELECT relkind FROM pg_class WHERE oid = old) = 'p' THEN RETURN; "
    "END IF; "
    "SELECT quote_ident(n.nspname), c.relowner::regrole INTO nsp, owner "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.oid = old; "
    /* LIKE copies a CHECK as valid, and ATTACH then refuses the old
     * table's NOT VALID one (004's while older rows break it). */
    "SELECT string_agg(conname, ', ' ORDER BY conname) INTO why FROM "
    "pg_constraint WHERE conrelid = old AND contype = 'c' AND NOT "
    "convalidated; "
    "IF why IS NOT NULL THEN RAISE EXCEPTION USING ERRCODE = '55000', "
    "MESSAGE = format('%s cannot become partitioned while its CHECK %s "
    "is not valid: rows written before it break it; the relay fails each "
    "as it meets it, `outbox-relay migrate` validates the CHECK once none "
    "is left, and then this can run', {{lit}}, why); END IF; "
    /* What names the table by oid would stay with the default partition
     * or cannot be carried over: refused, named. */
    "SELECT string_agg(what, ', ' ORDER BY what) INTO why FROM ("
    "SELECT DISTINCT 'view ' || w.ev_class::regclass AS what "
    "FROM pg_depend d JOIN pg_rewrite w ON d.classid = "
    "'pg_rewrite'::regclass AND d.objid = w.oid "
    "WHERE d.refobjid = old AND w.ev_class <> old "
    "UNION ALL SELECT 'rule ' || rulename FROM pg_rewrite "
    "WHERE ev_class = old "
    "UNION ALL SELECT 'foreign key ' || conname || ' of ' || "
    "conrelid::regclass FROM pg_constraint WHERE contype = 'f' AND "
    "(conrelid = old OR confrelid = old) "
    "UNION ALL SELECT 'publication ' || p.pubname FROM "
    "pg_publication_rel x JOIN pg_publication p ON p.oid = x.prpubid "
    "WHERE x.prrelid = old "
    "UNION ALL SELECT 'trigger ' || tgname FROM pg_trigger WHERE tgrelid "
    "= old AND NOT tgisinternal AND tgname <> '{{n}}_notify' "
    "UNION ALL SELECT 'policy ' || polname FROM pg_policy "
    "WHERE polrelid = old "
    "UNION ALL SELECT 'inheritance with ' || CASE WHEN inhparent = old "
    "THEN inhrelid ELSE inhparent END::regclass FROM pg_inherits "
    "WHERE inhparent = old OR inhrelid = old "
    "UNION ALL SELECT 'unique index ' || c.relname || ' without id' "
    "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "WHERE i.indrelid = old AND i.indisunique AND NOT i.indisprimary "
    "UNION ALL SELECT 'privileges on column ' || attname FROM "
    "pg_attribute WHERE attrelid = old AND attacl IS NOT NULL) x; "
    "IF why IS NOT NULL THEN RAISE EXCEPTION USING ERRCODE = '55000', "
    "MESSAGE = format('%s cannot become partitioned: %s depend%s on it "
    "by oid and would stay with the old table; drop them, run it again, "
    "and create them on the partitioned table', {{lit}}, why, CASE WHEN "
    "why LIKE '%, %' THEN '' ELSE 's' END); END IF; "
    "EXECUTE format('ALTER TABLE %s RENAME TO %I', old, dflt); "
    "CREATE TABLE {{table}} (LIKE {{s}}\"{{n}}_default\" INCLUDING "
    "DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE INCLUDING IDENTITY "
    "INCLUDING COMMENTS INCLUDING STATISTICS INCLUDING GENERATED "
    "INCLUDING COMPRESSION) PARTITION BY RANGE (id); "
    /* The indexes keep their names on the new table (migrations and
     * operators name them); the old ones become the default's. */
    "FOR r IN SELECT c.relname, i.indisprimary FROM pg_index i JOIN "
    "pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = old "
    "ORDER BY c.relname LOOP "
    "renamed := CASE WHEN left(r.relname, length('{{n}}_')) = '{{n}}_' "
    "THEN '{{n}}_d' || substr(r.relname, length('{{n}}') + 1) "
    "ELSE 'd_' || r.relname END; "
    "IF octet_length(renamed) > 63 THEN RAISE EXCEPTION 'index % of % "
    "has too long a name to be renamed %', r.relname, {{lit}}, renamed; "
    "END IF; "
    "EXECUTE format('ALTER INDEX %s.%I RENAME TO %I', nsp, r.relname, "
    "renamed); "
    "IF r.indisprimary THEN EXECUTE format('ALTER TABLE {{table}} ADD "
    "CONSTRAINT %I PRIMARY KEY (id)', r.relname); "
    "ELSE def := replace(pg_get_indexdef(format('%s.%I', nsp, "
    "renamed)::regclass), format('INDEX %I ON %s.%I ', renamed, nsp, "
    "dflt), format('INDEX %I ON {{table}} ', r.relname)); "
    "IF position('{{table}}' IN def) = 0 THEN RAISE EXCEPTION "
    "'index % of %: cannot rewrite its definition %', r.relname, "
    "{{lit}}, def; END IF; EXECUTE def; END IF; END LOOP; "
    /* Its identity is a sequence of its own, which would start at 1
     * below every seq of the old rows: seq is every ordering's "older".
     * It takes the old one's state whole: a RESTART left it unused, read
     * as 0 by ordered mode's check of the rows against it, which refused
     * the table until the first insert. */
    "seq := pg_get_serial_sequence(format('%s.%I', nsp, dflt), 'seq'); "
    "EXECUTE format('SELECT last_value, is_called FROM %s', seq) INTO "
    "next, called; "
    "PERFORM setval(pg_get_serial_sequence('{{table}}', 'seq'), next, "
    "called); "
    /* Inserts take seq from the parent's identity; Postgres 17 and later
     * refuse to attach a table with one of its own (migrate_identity.c). */
    "EXECUTE format('ALTER TABLE %s.%I ALTER COLUMN seq DROP IDENTITY', "
    "nsp, dflt); "
    "IF owner <> current_user::regrole THEN EXECUTE format('ALTER TABLE "
    "{{table}} OWNER TO %s', owner); END IF; "
    "FOR r IN SELECT a.grantee, a.privilege_type, a.is_grantable FROM "
    "pg_class c, aclexplode(c.relacl) a WHERE c.oid = old AND a.grantee "
    "<> c.relowner LOOP EXECUTE format('GRANT %s ON {{table}} TO %s%s', "
    "r.privilege_type, CASE WHEN r.grantee = 0 THEN 'PUBLIC' ELSE "
    "r.grantee::regrole::text END, CASE WHEN r.is_grantable THEN ' WITH "
    "GRANT OPTION' ELSE '' END); END LOOP; "
    "EXECUTE format('COMMENT ON TABLE {{table}} IS %L', "
    "obj_description(old, 'pg_class')); "
    /* A statement trigger fires on the table the statement names. */
    "IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = old AND tgname "
    "= '{{n}}_notify') THEN DROP TRIGGER \"{{n}}_notify\" ON "
    "{{s}}\"{{n}}_default\"; CREATE TRIGGER \"{{n}}_notify\" AFTER INSERT "
    "ON {{table}} FOR EACH STATEMENT EXECUTE FUNCTION "
    "{{s}}\"{{n}}_notify\"(); END IF; "
    "SELECT count(*) INTO indexes FROM pg_index WHERE indrelid = old; "
    "ALTER TABLE {{table}} ATTACH PARTITION {{s}}\"{{n}}_default\" "
    "DEFAULT; "
    /* An index ATTACH did not adopt it built, under the lock: refused. */
    "IF (SELECT count(*) FROM pg_index WHERE indrelid = old) <> indexes "
    "OR EXISTS (SELECT 1 FROM pg_index WHERE indrelid = "
    "'{{table}}'::regclass AND NOT indisvalid) THEN RAISE EXCEPTION "
    "'% cannot become partitioned: an index of the old table does not "
    "match the new one''s', {{lit}}; END IF; "
    "END $step$";

static const struct contract_step partition_step = {
    "partition_by_id", 1, partition_sql, partition_sql, true};

/* Replicas seen alive that speak an older protocol than protocol (or
 * record none): how many, or -1 with err; the first few into who. */
static int live_below(PGconn *conn, const char *registry, int protocol,
		      char *who, size_t wholen, char *err, size_t errlen)
{
	char sql[512], p[16];
	snprintf(sql, sizeof(sql),
		 "SELECT id, version, coalesce(protocol::text, 'none'), "
		 "count(*) OVER () FROM %s WHERE last_seen_at > now() - %d * "
		 "interval '1 second' AND coalesce(protocol, 0) < $1::integer "
		 "ORDER BY id LIMIT 3",
		 registry, STORE_ADMIN_DEAD_AFTER_S);
	snprintf(p, sizeof(p), "%d", protocol);
	const char *values[1] = {p};
	PGresult *res = PQexecParams(conn, sql, 1, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		pgconn_error(conn, res, err, errlen);
		PQclear(res);
		return -1;
	}
	int n = PQntuples(res) ? atoi(PQgetvalue(res, 0, 3)) : 0;
	size_t len = 0;
	who[0] = '\0';
	for (int i = 0; i < PQntuples(res) && len < wholen; i++) {
		int w = snprintf(who + len, wholen - len,
				 "%s%s (version %s, protocol %s)",
				 i ? ", " : "", PQgetvalue(res, i, 0),
				 PQgetvalue(res, i, 1), PQgetvalue(res, i, 2));
		len += w > 0 ? (size_t)w : 0;
	}
	PQclear(res);
	return n;
}

/* One statement with up to two parameters; false with err. */
static bool run(PGconn *conn, const char *sql, const char *a, const char *b,
		int *rows, char *err, size_t errlen)
{
	const char *values[2] = {a, b};
	int n = b ? 2 : a ? 1 : 0;
	PGresult *res = PQexecParams(conn, sql, n, NULL, values, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);
	bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
	if (!ok)
		pgconn_error(conn, res, err, errlen);
	else if (rows)
		*rows = st == PGRES_TUPLES_OK ? PQntuples(res)
					      : atoi(PQcmdTuples(res));
	PQclear(res);
	return ok;
}

/* How long the record of step, if any, has still to settle: settle_ms
 * less its age by the server's clock (0 once settled). 1 with *ms when
 * recorded, 0 when not, -1 with err. */
static int record_settles_in(PGconn *conn, const char *contract,
			     const char *step, int settle_ms, long *ms,
			     char *err, size_t errlen)
{
	char sql[512], settle[16];
	snprintf(sql, sizeof(sql),
		 "SELECT greatest(0, $2::float8 - 1000 * extract(epoch FROM "
		 "clock_timestamp() - applied_at))::bigint FROM %s WHERE step "
		 "= $1",
		 contract);
	snprintf(settle, sizeof(settle), "%d", settle_ms);
	const char *values[2] = {step, settle};
	PGresult *res = PQexecParams(conn, sql, 2, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		pgconn_error(conn, res, err, errlen);
		PQclear(res);
		return -1;
	}
	int n = PQntuples(res);
	if (n > 0)
		*ms = atol(PQgetvalue(res, 0, 0));
	PQclear(res);
	return n > 0;
}

/* Records step, unless a replica of an older protocol is alive before or
 * within settle_ms after: a relay that opened the table before the record
 * passed its own check, and tells of itself by its next heartbeat. A
 * record younger than settle_ms (made by `migrate` of many tables, which
 * records every table's steps before it waits once for them all, or by
 * a run stopped while it waited) waits the rest and is checked again,
 * its step not yet run by anyone: a step runs only once its record has
 * settled. A record settled before is looked at once more (below). With
 * settle false, only records (no wait, no second look). 1: recorded and
 * settled before; 2 (settle false): recorded before, not yet settled; 0:
 * recorded now, or settled now; -1 with err. */
static int record_step(PGconn *conn, const struct outbox_table *t,
		       const struct contract_step *c, int settle_ms,
		       bool settle, char *err, size_t errlen)
{
	char contract[160], registry[160], p[16], who[512], why[512];
	char sql[512];
	table_derived(t, "_contract", contract, sizeof(contract));
	table_derived(t, "_replicas", registry, sizeof(registry));
	snprintf(p, sizeof(p), "%d", c->protocol);
	long wait_ms = settle_ms;
	int had = record_settles_in(conn, contract, c->name, settle_ms,
				    &wait_ms, why, sizeof(why));
	if (had < 0)
		goto failed;
	if (had && !settle)
		return wait_ms == 0 ? 1 : 2;
	/* Settled before, its step may never have run (it failed or was
	 * refused: "recorded; run it again"), and a relay of an older
	 * protocol may have started since: one older than the registry's
	 * protocol column reads no record, and a step run under it (a
	 * table partitioned under a relay that names rows by bare ctid)
	 * loses rows. Looked for once more, without a wait; the record
	 * stays, as relays that read it must keep refusing the table. */
	bool settled = had && wait_ms == 0;
	for (int round = had ? 1 : 0; round < 2; round++) {
		if (round == 1 && !settled)
			clock_sleep_ms(wait_ms);
		int n = live_below(conn, registry, c->protocol, who,
				   sizeof(who), why, sizeof(why));
		if (n < 0)
			goto failed;
		if (n > 0) {
			if (!settled) {
				snprintf(sql, sizeof(sql),
					 "DELETE FROM %s WHERE step = $1",
					 contract);
				run(conn, sql, c->name, NULL, NULL, why,
				    sizeof(why));
			}
			snprintf(err, errlen,
				 "contract step %s of %s needs every relay to "
				 "speak protocol %d, and %d replica%s seen "
				 "alive in the last %d s speak%s an older "
				 "one: %s%s; upgrade %s (or wait until %s "
				 "gone) and run it again",
				 c->name, t->literal, c->protocol, n,
				 n == 1 ? "" : "s", STORE_ADMIN_DEAD_AFTER_S,
				 n == 1 ? "s" : "", who, n > 3 ? ", ..." : "",
				 n == 1 ? "it" : "them",
				 n == 1 ? "it is" : "they are");
			return -1;
		}
		if (settled)
			return 1;
		if (round == 1)
			break;
		snprintf(sql, sizeof(sql),
			 "INSERT INTO %s (step, protocol) VALUES ($1, "
			 "$2::integer) ON CONFLICT (step) DO NOTHING",
			 contract);
		if (!run(conn, sql, c->name, p, NULL, why, sizeof(why)))
			goto failed;
		if (!settle)
			break;
	}
	return 0;
failed:
	snprintf(err, errlen, "contract step %s of %s: %s", c->name, t->literal,
		 why);
	return -1;
}

/* Every expand migration has run: the registry has its protocol column
 * and the contract table exists. */
static bool expanded(PGconn *conn, const struct outbox_table *t, char *err,
		     size_t errlen)
{
	char version[160], sql[256], why[512];
	table_derived(t, "_schema_version", version, sizeof(version));
	snprintf(sql, sizeof(sql),
		 "SELECT 1 FROM %s HAVING coalesce(max(version), 0) >= %d",
		 version, sql_schema_version);
	int rows = 0;
	bool ran = run(conn, sql, NULL, NULL, &rows, why, sizeof(why));
	if (ran && rows > 0)
		return true;
	snprintf(err, errlen,
		 "contract steps of %s: the table is not at schema version "
		 "%d%s%s; run `outbox-relay migrate` first",
		 t->literal, sql_schema_version, ran ? "" : " (",
		 ran ? "" : why);
	if (!ran && strlen(err) + 2 < errlen)
		strcat(err, ")");
	return false;
}

/* Each of steps (n of them) on opt's table, recorded first: see
 * store_contract(). With record_only, the records alone
 * (store_contract_record()). */
static int run_steps(const struct store_options *opt, int settle_ms,
		     bool record_only, const struct contract_step *steps,
		     size_t n, FILE *out, char *err, size_t errlen)
{
	struct outbox_table t;
	struct pgconn_options po;
	int rc;
	/* No statement_timeout: DROP INDEX CONCURRENTLY waits for every
	 * transaction that may still use the index. */
	PGconn *conn = migrate_session(opt, &t, &po, &rc, err, errlen);
	if (!conn)
		return rc;
	rc = STORE_ERROR;
	char why[512];
	/* "does not exist, skipping" is no news on a second run. */
	run(conn, "SET client_min_messages = warning", NULL, NULL, NULL, why,
	    sizeof(why));
	if (!expanded(conn, &t, err, errlen))
		goto out;
	if (migrate_lock(conn, &t, why, sizeof(why)) != 0) {
		snprintf(err, errlen, "contract steps of %s: %s", t.literal,
			 why);
		goto out;
	}
	int rows = 0;
	if (!run(conn,
		 "SELECT 1 FROM pg_class WHERE oid = to_regclass($1) AND "
		 "relkind = 'p'",
		 t.quoted, NULL, &rows, why, sizeof(why))) {
		snprintf(err, errlen, "contract steps of %s: %s", t.literal,
			 why);
		goto unlock;
	}
	bool partitioned = rows > 0;
	/* An invalid index left by a build cut short would be copied to
	 * the partitioned table, whose ATTACH then builds a valid one on
	 * the whole old table under ACCESS EXCLUSIVE, every write waiting,
	 * before the step fails on it. */
	if (!record_only && steps == &partition_step &&
	    migrate_drop_invalid_indexes(conn, &t, out, why, sizeof(why)) !=
		0) {
		snprintf(err, errlen, "partitioning %s: %s", t.literal, why);
		goto unlock;
	}
	for (size_t i = 0; i < n; i++) {
		const struct contract_step *c = &steps[i];
		if (migrate_lock_held(conn, &t, why, sizeof(why)) != 0) {
			snprintf(err, errlen, "contract step %s of %s: %s",
				 c->name, t.literal, why);
			goto unlock;
		}
		int had = record_step(conn, &t, c, settle_ms, !record_only, err,
				      errlen);
		if (had < 0)
			goto unlock;
		if (record_only) {
			if (out && had == 0)
				fprintf(out,
					"contract step %s (protocol %d): "
					"recorded\n",
					c->name, c->protocol);
			continue;
		}
		char *sql = migrate_expand(
		    partitioned ? c->sql_partitioned : c->sql, &t);
		if (!sql)
			snprintf(why, sizeof(why), "out of memory");
		bool short_wait = partitioned || c->blocks_writes;
		bool ok = sql &&
			  migrate_exec_retrying(conn, sql,
						short_wait ? DDL_WAIT_SHORT
							   : DDL_WAIT_UNBOUNDED,
						why, sizeof(why)) == 0;
		free(sql);
		if (!ok) {
			snprintf(err, errlen,
				 "contract step %s of %s (recorded; run it "
				 "again): %s",
				 c->name, t.literal, why);
			goto unlock;
		}
		if (out)
			fprintf(out, "contract step %s (protocol %d): %s\n",
				c->name, c->protocol,
				had ? "recorded before, done" : "done");
	}
	/* A table just partitioned gets the partitioned shape's index of
	 * finished rows now, not at the next migrate. */
	if (!record_only &&
	    migrate_terminal(conn, &t, out, NULL, err, errlen) != 0)
		goto unlock;
	rc = STORE_OK;
unlock:
	migrate_unlock(conn, &t);
out:
	PQfinish(conn);
	return rc;
}

int store_contract_settled(const struct store_options *opt, int settle_ms,
			   FILE *out, char *err, size_t errlen)
{
	return run_steps(opt, settle_ms, false, contract_steps,
			 sizeof(contract_steps) / sizeof(contract_steps[0]),
			 out, err, errlen);
}

int store_contract(const struct store_options *opt, FILE *out, char *err,
		   size_t errlen)
{
	return store_contract_settled(opt, STORE_CONTRACT_SETTLE_MS, out, err,
				      errlen);
}

int store_contract_record(const struct store_options *opt, bool contract,
			  bool partition, FILE *out, char *err, size_t errlen)
{
	int rc = STORE_OK;
	if (contract)
		rc = run_steps(
		    opt, STORE_CONTRACT_SETTLE_MS, true, contract_steps,
		    sizeof(contract_steps) / sizeof(contract_steps[0]), out,
		    err, errlen);
	if (rc == STORE_OK && partition)
		rc = run_steps(opt, STORE_CONTRACT_SETTLE_MS, true,
			       &partition_step, 1, out, err, errlen);
	return rc;
}

int store_partition_settled(const struct store_options *opt, int settle_ms,
			    FILE *out, char *err, size_t errlen)
{
	return run_steps(opt, settle_ms, false, &partition_step, 1, out, err,
			 errlen);
}

int store_partition(const struct store_options *opt, FILE *out, char *err,
		    size_t errlen)
{
	return store_partition_settled(opt, STORE_CONTRACT_SETTLE_MS, out, err,
				       errlen);
}

int store_partition_unrecorded(PGconn *conn, const struct outbox_table *t,
			       char *err, size_t errlen)
{
	char *sql = migrate_expand(partition_sql, t);
	if (!sql) {
		snprintf(err, errlen, "out of memory");
		return STORE_ERROR;
	}
	int rc = migrate_exec_retrying(conn, sql, DDL_WAIT_SHORT, err, errlen);
	free(sql);
	if (rc == 0)
		rc = migrate_terminal(conn, t, NULL, NULL, err, errlen);
	return rc == 0 ? STORE_OK : STORE_ERROR;
}
