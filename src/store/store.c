/* SPDX-License-Identifier: MIT */
/*
 * The store's session: opening it (and checking the table and its schema
 * version and side tables), the settings its transactions carry, and
 * reconnecting. Statements run through run.c.
 */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/base.h"
#include "config/config.h"
#include "pgconn.h"
#include "schema.h"
#include "store_internal.h"
#include "store_test.h"

struct store_options store_options_from_config(const struct config *cfg,
					       const char *app_name,
					       const char *leased_by)
{
	struct store_options o = {
	    .conninfo = config_database_url(cfg, 0),
	    /* The first listed table (not a pattern), NULL when there is
	     * none; a caller of another source sets its own. */
	    .table = config_first_table(cfg),
	    .app_name = app_name,
	    .leased_by = leased_by,
	    .ce_source = cfg->ce_source,
	    .batch_size = cfg->batch_size,
	    .batch_bytes = cfg->batch_bytes,
	    .clean_batch_size = cfg->clean_batch_size,
	    .lease_timeout_ms = cfg->lease_timeout_ms,
	    .lease_rescan_ms = cfg->lease_rescan_ms,
	    .statement_timeout_ms = cfg->statement_timeout_ms,
	    /* A cut relay's session must end well before its lease. */
	    .dead_peer_ms = cfg->pg_dead_peer_ms < cfg->lease_timeout_ms / 2
				? cfg->pg_dead_peer_ms
				: cfg->lease_timeout_ms / 2,
	    .backoff_base_ms = cfg->backoff_base_ms,
	    .backoff_max_ms = cfg->backoff_max_ms,
	    .backoff_factor = cfg->backoff_factor,
	    .prepare = cfg->pg_prepare != PG_PREPARE_OFF,
	    .prepare_pooled = cfg->pg_prepare == PG_PREPARE_POOLED,
	    .ordered = cfg->ordering == ORDERING_PARTITION,
	    .block_on_failure = cfg->on_failure == ON_FAILURE_BLOCK,
	    .delete_sent = cfg->retention_ms == 0,
	};
	return o;
}

/* Expand-then-contract: `migrate` runs before relays of a new version, so
 * a relay refuses a table whose schema is older than it needs. */
static int check_version(struct store *s, const char *lit, char *err,
			 size_t errlen)
{
	int rc;
	const char *sql = store_sql(s, ST_VERSION);
	if (!sql) {
		snprintf(err, errlen, "store: out of memory");
		return STORE_ERROR;
	}
	PGresult *res = store_exec(s, NULL, sql, 0, NULL, PGRES_TUPLES_OK, &rc,
				   err, errlen);
	if (!res)
		/* A table made by hand has no version table: its columns are
		 * the owner's business. */
		return store_err_undefined_table(err) ? 0 : store_public_rc(rc);
	if (strtol(PQgetvalue(res, 0, 0), NULL, 10) < sql_schema_version) {
		snprintf(err, errlen,
			 "outbox table %s is at schema version %s and this "
			 "relay needs %d: run `outbox-relay migrate`",
			 lit, PQgetvalue(res, 0, 0), sql_schema_version);
		rc = STORE_ERROR;
	}
	PQclear(res);
	return rc;
}

/* ... and one whose contract steps need a newer protocol than its own:
 * what they dropped, it may still need. */
static int check_contract(struct store *s, const char *lit, char *err,
			  size_t errlen)
{
	char contract[160], proto[16];
	table_derived(&s->table, "_contract", contract, sizeof(contract));
	snprintf(proto, sizeof(proto), "%d", STORE_PROTOCOL);
	char *sql = store_asprintf("SELECT step, protocol FROM %s WHERE "
				   "protocol > $1::integer ORDER BY protocol "
				   "DESC, step LIMIT 1",
				   contract);
	if (!sql) {
		snprintf(err, errlen, "store: out of memory");
		return STORE_ERROR;
	}
	int rc;
	PGresult *res =
	    store_exec(s, NULL, sql, 1, (const char *const[]){proto},
		       PGRES_TUPLES_OK, &rc, err, errlen);
	free(sql);
	if (!res)
		return store_err_undefined_table(err) ? 0 : store_public_rc(rc);
	if (PQntuples(res) > 0) {
		snprintf(err, errlen,
			 "outbox table %s has had contract step %s, which "
			 "needs relays of protocol %s, and this relay speaks "
			 "%d: run a newer relay",
			 lit, PQgetvalue(res, 0, 0), PQgetvalue(res, 0, 1),
			 STORE_PROTOCOL);
		rc = STORE_ERROR;
	}
	PQclear(res);
	return rc;
}

/*
 * Ordered mode reads "older" by seq, which means it only while every row
 * took its seq from the table's sequence (docs/design.md §6). A copy made
 * by logical replication carries the rows and not the sequence, and
 * `migrate` on the copy moves the sequence past them; a relay connected
 * to a copy that missed it would send the keys' new events before their
 * copied ones, so it refuses the table, at start and at every reconnect
 * (a switch behind one host name), as it refuses one at an older schema
 * version. The check is migrate's: the newest rows by id against the
 * sequence, one short index read. A role that may not read the sequence
 * (grants older than sql/grants.sql's) is told once, and not refused.
 */
static int check_seq(struct store *s, const char *lit, char *err, size_t errlen)
{
	char *sql = store_asprintf(
	    "WITH q AS (SELECT pg_get_serial_sequence($1, 'seq') AS sq), c AS "
	    "(SELECT sq, has_sequence_privilege(sq, 'SELECT, USAGE') AS may "
	    "FROM q WHERE sq IS NOT NULL) SELECT sq, may, CASE WHEN may THEN "
	    "coalesce(pg_sequence_last_value(sq::regclass), 0) END, CASE "
	    "WHEN may THEN " SQL_NEWEST_SEQ " END FROM c",
	    s->table.quoted);
	if (!sql) {
		snprintf(err, errlen, "store: out of memory");
		return STORE_ERROR;
	}
	int rc;
	const char *values[1] = {s->table.quoted};
	PGresult *res = store_exec(s, "seq's sequence", sql, 1, values,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	free(sql);
	if (!res)
		return store_public_rc(rc);
	if (PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 1), "f") == 0) {
		if (!s->seq_unchecked_said)
			log_warn(
			    "ordered mode cannot check outbox table %s's "
			    "seq against its sequence %s: this role may "
			    "not read it; grant SELECT on it (sql/grants.sql)",
			    lit, PQgetvalue(res, 0, 0));
		s->seq_unchecked_said = true;
	} else if (PQntuples(res) == 1 && !PQgetisnull(res, 0, 3) &&
		   strtoll(PQgetvalue(res, 0, 3), NULL, 10) >
		       strtoll(PQgetvalue(res, 0, 2), NULL, 10)) {
		snprintf(err, errlen,
			 "outbox table %s has rows up to seq %s past its "
			 "sequence, at %s (a copy whose sequence did not come "
			 "along, as by logical replication): ordered mode "
			 "would send a key's newer events before its older "
			 "ones; run `outbox-relay migrate` on this database",
			 lit, PQgetvalue(res, 0, 3), PQgetvalue(res, 0, 2));
		rc = STORE_ERROR;
	}
	PQclear(res);
	return rc;
}

static int check_table(struct store *s, char *err, size_t errlen)
{
	const char *values[1];
	char lit[160];
	int rc;
	snprintf(lit, sizeof(lit), "%s%s%s", s->table.schema,
		 s->table.schema[0] ? "." : "", s->table.name);
	/* Quoted, as every statement names it: unquoted, to_regclass()
	 * would fold a mixed-case name to lower case. */
	values[0] = s->table.quoted;
	PGresult *res =
	    store_exec(s, NULL, "SELECT to_regclass($1) IS NOT NULL", 1, values,
		       PGRES_TUPLES_OK, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	bool exists = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	if (!exists) {
		char where[256];
		pgconn_describe(s->ses->conn, where, sizeof(where));
		snprintf(err, errlen,
			 "outbox table %s does not exist in %s: create it with "
			 "`outbox-relay migrate`",
			 lit, where);
		return STORE_ERROR;
	}
	rc = check_version(s, lit, err, errlen);
	if (rc == 0)
		rc = check_contract(s, lit, err, errlen);
	return rc == 0 && s->opt.ordered ? check_seq(s, lit, err, errlen) : rc;
}

int store_admin_side_tables(struct store *s, unsigned *present, char *err,
			    size_t errlen)
{
	const struct {
		const char *suffix;
		unsigned bit;
	} side[] = {
	    {"_control", STORE_SIDE_CONTROL},
	    {"_replicas", STORE_SIDE_REPLICAS},
	    {"_blocked_keys", STORE_SIDE_BLOCKED_KEYS},
	    {"_claims", STORE_SIDE_CLAIMS},
	};
	enum { N_SIDE = sizeof(side) / sizeof(side[0]) };
	char names[N_SIDE][160];
	const char *values[N_SIDE];
	int rc;
	*present = 0;
	for (size_t i = 0; i < N_SIDE; i++) {
		table_derived(&s->table, side[i].suffix, names[i],
			      sizeof(names[i]));
		values[i] = names[i];
	}
	const char *all[N_SIDE + 1];
	memcpy(all, values, sizeof(values));
	all[N_SIDE] = s->table.quoted;
	PGresult *res = store_exec(
	    s, "side tables",
	    "SELECT to_regclass($1) IS NOT NULL, to_regclass($2) "
	    "IS NOT NULL, to_regclass($3) IS NOT NULL, to_regclass($4) "
	    "IS NOT NULL, EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid "
	    "= to_regclass($5) AND attname = 'written_by' AND NOT "
	    "attisdropped), EXISTS (SELECT 1 FROM pg_attribute WHERE "
	    "attrelid = to_regclass($5) AND attname = 'relay_source' AND NOT "
	    "attisdropped)",
	    N_SIDE + 1, all, PGRES_TUPLES_OK, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	for (size_t i = 0; i < N_SIDE; i++)
		if (PQgetvalue(res, 0, (int)i)[0] == 't')
			*present |= side[i].bit;
	if (PQgetvalue(res, 0, N_SIDE)[0] == 't')
		*present |= STORE_COLUMN_WRITTEN_BY;
	if (PQgetvalue(res, 0, N_SIDE + 1)[0] == 't')
		*present |= STORE_COLUMN_RELAY_SOURCE;
	PQclear(res);
	return 0;
}

int store_schema_version(void)
{
	return sql_schema_version;
}

/* What the statements read in place of a missing side table: no pause,
 * no blocked key, which is exactly what a table without them can hold. */
#define NO_BLOCKED_KEYS                                                        \
	"(SELECT NULL::text AS partition_key, NULL::uuid AS blocking_id "      \
	"WHERE false)"

/* Drops every statement text (s->blocked changed): each is built again
 * on its next use. */
static void rebuild_statements(struct store *s)
{
	for (int i = 0; i < ST_COUNT; i++) {
		free(s->sql[i]);
		s->sql[i] = NULL;
	}
}

/*
 * A table made by hand may lack the control and blocked-keys tables
 * (store.h, docs/design.md §11): the statements then read none instead of
 * failing every loop. Checked at each connect, so a session opened after
 * `outbox-relay migrate` uses the real tables.
 */
static int adapt_to_side_tables(struct store *s, char *err, size_t errlen)
{
	unsigned present = 0;
	int rc = store_admin_side_tables(s, &present, err, errlen);
	if (rc != 0)
		return rc;
	char blocked[sizeof(s->blocked)];
	table_derived(&s->table, "_blocked_keys", blocked, sizeof(blocked));
	if (!(present & STORE_SIDE_BLOCKED_KEYS)) {
		if (s->opt.block_on_failure) {
			snprintf(err, errlen,
				 "OUTBOX_ORDERING_ON_FAILURE=block needs the "
				 "table %s%s%s_blocked_keys, which does not "
				 "exist: create it with `outbox-relay migrate`",
				 s->table.schema, s->table.schema[0] ? "." : "",
				 s->table.name);
			return STORE_ERROR;
		}
		snprintf(blocked, sizeof(blocked), "%s", NO_BLOCKED_KEYS);
	}
	/* Without claims, leases go on unrecorded (docs/design.md §11). */
	s->claims_missing = !(present & STORE_SIDE_CLAIMS);
	if (strcmp(blocked, s->blocked) != 0) {
		snprintf(s->blocked, sizeof(s->blocked), "%s", blocked);
		rebuild_statements(s);
	}
	s->control_off = !(present & STORE_SIDE_CONTROL);
	/* Without written_by (a table made by hand before migration 007)
	 * the lease has no late scan: late commits wait for a rescan. */
	bool written_missing = !(present & STORE_COLUMN_WRITTEN_BY);
	/* Without relay_source (made by hand before migration 009) the
	 * source is pinned into source itself, as before 009. */
	bool pin_missing = !(present & STORE_COLUMN_RELAY_SOURCE);
	if (written_missing != s->written_missing ||
	    pin_missing != s->relay_source_missing) {
		s->written_missing = written_missing;
		s->relay_source_missing = pin_missing;
		s->key_map_built = false;
		rebuild_statements(s);
	}
	return 0;
}

int store_claims_table_there(struct store *s)
{
	unsigned present = 0;
	char why[256];
	if (store_admin_side_tables(s, &present, why, sizeof(why)) != 0)
		return -1;
	return (present & STORE_SIDE_CLAIMS) != 0;
}

bool store_claims_table_gone(struct store *s)
{
	return store_claims_table_there(s) == 0;
}

/* How the store's sessions connect: the settings of pgconn_options go
 * into each transaction (s->tx_settings), never on the session. */
static struct pgconn_options session_options(const struct store *s)
{
	struct pgconn_options po = {
	    .conninfo = s->conninfo,
	    .application_name = s->app_name,
	    .statement_timeout_ms = s->opt.statement_timeout_ms,
	    .lock_timeout_ms = s->opt.lock_timeout_ms,
	    .dead_peer_ms = s->opt.dead_peer_ms,
	    .extra_sql = s->extra_sql,
	    .scope = PGCONN_TRANSACTION,
	};
	return po;
}

/* The settings of each kind of transaction; -1 when out of memory. The
 * lease transaction's idle-in-transaction timeout is the lease timeout:
 * it ends a stalled lease (docs/design.md §4). */
static int build_tx_settings(struct store *s)
{
	struct pgconn_options po = session_options(s);
	s->tx_settings[PGCONN_TX_STATEMENT] =
	    pgconn_tx_settings(&po, PGCONN_TX_STATEMENT);
	s->tx_settings[PGCONN_TX_EXPLICIT] =
	    pgconn_tx_settings(&po, PGCONN_TX_EXPLICIT);
	s->tx_settings[PGCONN_TX_INDEXED] =
	    pgconn_tx_settings(&po, PGCONN_TX_INDEXED);
	po.idle_in_transaction_ms = s->opt.lease_timeout_ms;
	s->tx_settings[PGCONN_TX_LEASE] =
	    pgconn_tx_settings(&po, PGCONN_TX_LEASE);
	if (!s->tx_settings[PGCONN_TX_LEASE])
		return -1;
	s->lease_probe_sql = store_asprintf(
	    "%s, %s", s->tx_settings[PGCONN_TX_LEASE], STORE_POOLED_PROBE);
	if (!s->lease_probe_sql)
		return -1;
	for (size_t i = 0; i < sizeof(s->tx_settings) / sizeof(*s->tx_settings);
	     i++) {
		if (!s->tx_settings[i])
			return -1;
		s->tx_hash[i] = store_text_hash(s->tx_settings[i]);
	}
	return 0;
}

/* Checks s's table on its session, which is connected. */
static int check_on_session(struct store *s, char *err, size_t errlen)
{
	s->checking = true;
	int rc = check_table(s, err, errlen);
	if (rc == 0)
		rc = adapt_to_side_tables(s, err, errlen);
	s->checking = false;
	if (rc == 0)
		s->checked_gen = s->ses->conn_gen;
	return rc;
}

int store_check_session(struct store *s, char *err, size_t errlen)
{
	return s->checking || s->checked_gen == s->ses->conn_gen
		   ? 0
		   : check_on_session(s, err, errlen);
}

/* OUTBOX_PG_PREPARE=on: whether conn reaches the server process it was
 * opened with, asked before any statement of the relay's (each runs
 * after its transaction's settings, which are named too). A pooler
 * answers the connection itself, under a process id of its own making
 * (as migrate's check, migrate.c): prepared once a session, the relay's
 * statements would meet its other server connections only as one failed
 * there, maybe a mark after its batch was published, so the relay
 * prepares as pooled from the start (prepare_mode.c). False, with err, when the
 * question failed: the session is lost. */
static bool through_pooler_checked(PGconn *conn, char *err, size_t errlen)
{
	long server_pid;
	char why[512];
	if (pgconn_server_pid(conn, &server_pid, why, sizeof(why)) != 0) {
		snprintf(err, errlen, "asking the server's process id: %s",
			 why);
		return false;
	}
	if (server_pid != PQbackendPID(conn))
		store_prepare_behind_pooler(server_pid, PQbackendPID(conn));
	return true;
}

/* Connects s's session anew (the session's other stores see its new
 * generation and prepare again), and checks s's table on it. */
static int connect_session(struct store *s, char *err, size_t errlen)
{
	struct store_session *ses = s->ses;
	struct pgconn_options po = session_options(s);
	if (ses->conn) {
		PQfinish(ses->conn);
		ses->conn = NULL;
	}
	ses->leasing = NULL;
	ses->conn_gen++;
	ses->server_ended = false;
	ses->conn = pgconn_connect(&po, err, errlen);
	if (!ses->conn)
		return STORE_RECONNECT;
	pgconn_hear(ses->conn, &ses->server_ended);
	if (s->opt.prepare && !s->opt.prepare_pooled &&
	    !store_prepare_mode_known() &&
	    !through_pooler_checked(ses->conn, err, errlen)) {
		/* Not kept: a later use (the claim store's open, a source
		 * retried after its backoff) would take it unasked. */
		PQfinish(ses->conn);
		ses->conn = NULL;
		return STORE_RECONNECT;
	}
	return check_on_session(s, err, errlen);
}

/* Drops a reference to ses; the last one closes it. */
static void session_put(struct store_session *ses)
{
	if (!ses || --ses->users > 0)
		return;
	if (ses->conn)
		PQfinish(ses->conn);
	session_put(ses->claim);
	free(ses);
}

static char *dup_or_null(const char *v)
{
	return v ? strdup(v) : NULL;
}

/*
 * The holder of this store's claims: leased_by ("host/pid/worker") and a
 * random instance. Two relays can share all three (two containers of one
 * pod, each pid 1, one hostname): with one holder, each would take the
 * other's claim for its own, and one could not lease while the other's
 * lease was open. NULL leased_by: a session that leases nothing.
 */
static int holder_of(const char *leased_by, char **out, char *err,
		     size_t errlen)
{
	uint32_t instance;
	*out = NULL;
	if (!leased_by)
		return 0;
	if (getrandom(&instance, sizeof(instance), 0) !=
	    (ssize_t)sizeof(instance)) {
		snprintf(err, errlen,
			 "store: no random bytes for the claim holder");
		return STORE_ERROR;
	}
	*out = store_asprintf("%s/%08x", leased_by, (unsigned)instance);
	if (!*out) {
		snprintf(err, errlen, "store: out of memory");
		return STORE_ERROR;
	}
	return 0;
}

/* Validates opt into s and copies the strings s keeps. */
static int take_options(struct store *s, const struct store_options *opt,
			const char *session_sql, char *err, size_t errlen)
{
	s->opt = *opt;
	if (!opt->table) {
		snprintf(err, errlen,
			 "no outbox table: OUTBOX_TABLE has only patterns and "
			 "none has matched a table yet");
		return STORE_ERROR;
	}
	if (table_parse(opt->table, &s->table, err, errlen) != 0)
		return STORE_ERROR;
	table_derived(&s->table, "_blocked_keys", s->blocked,
		      sizeof(s->blocked));
	table_derived(&s->table, "_claims", s->claims, sizeof(s->claims));
	if (opt->batch_size < 1 || opt->batch_size > 10000) {
		snprintf(err, errlen, "batch size %d is outside 1..10000",
			 opt->batch_size);
		return STORE_ERROR;
	}
	if (s->opt.batch_bytes <= 0)
		s->opt.batch_bytes = INT64_MAX / 2;
	if (s->opt.clean_batch_size < 1)
		s->opt.clean_batch_size = 1000;
	if (s->opt.backoff_factor < 1.0)
		s->opt.backoff_factor = 2.0;
	s->conninfo = dup_or_null(opt->conninfo);
	s->app_name = strdup(opt->app_name ? opt->app_name : "outbox-relay");
	if (holder_of(opt->leased_by, &s->leased_by, err, errlen) != 0)
		return STORE_ERROR;
	if (!s->leased_by)
		s->leased_by = strdup("?");
	s->ce_source =
	    strdup(opt->ce_source ? opt->ce_source : "/outbox-relay");
	s->extra_sql = dup_or_null(session_sql);
	if ((opt->conninfo && !s->conninfo) || !s->app_name || !s->leased_by ||
	    !s->ce_source || (session_sql && !s->extra_sql) ||
	    build_tx_settings(s) != 0) {
		snprintf(err, errlen, "store: out of memory");
		return STORE_ERROR;
	}
	s->opt.conninfo = s->conninfo;
	return 0;
}

int store_open_on(struct store **out, const struct store_options *opt,
		  struct store_session *ses, const char *session_sql, char *err,
		  size_t errlen)
{
	int rc = STORE_ERROR;
	struct store *s = calloc(1, sizeof(*s));
	*out = NULL;
	if (!s || (!ses && !(ses = calloc(1, sizeof(*ses))))) {
		free(s);
		snprintf(err, errlen, "store: out of memory");
		return STORE_ERROR;
	}
	s->ses = ses;
	s->key_walk_cap = KEY_WALK_CAP;
	if (ses->tags > 0)
		snprintf(s->tag, sizeof(s->tag), "t%u_", ses->tags);
	ses->tags++;
	ses->users++;
	rc = take_options(s, opt, session_sql, err, errlen);
	bool shared = rc == 0 && ses->conn;
	if (rc == 0)
		rc = shared ? check_on_session(s, err, errlen)
			    : connect_session(s, err, errlen);
	/* The session shared with was lost since its last statement (a
	 * server restart): connected anew for all its stores, as their next
	 * statement would have. Left failed, the new source was set aside
	 * as failing, its first events waiting out a backoff of up to 30 s,
	 * until some other statement of the session reconnected it. */
	if (shared && rc == STORE_RECONNECT && !ses->reply_late)
		rc = connect_session(s, err, errlen);
	if (rc != 0) {
		store_close(s);
		return rc;
	}
	*out = s;
	return 0;
}

int store_open_traced(struct store **out, const struct store_options *opt,
		      const char *session_sql, char *err, size_t errlen)
{
	return store_open_on(out, opt, NULL, session_sql, err, errlen);
}

int store_open_sharing(struct store **out, const struct store_options *opt,
		       struct store *with, char *err, size_t errlen)
{
	return store_open_on(out, opt, with ? with->ses : NULL,
			     with ? with->extra_sql : NULL, err, errlen);
}

int store_open(struct store **out, const struct store_options *opt, char *err,
	       size_t errlen)
{
	return store_open_traced(out, opt, NULL, err, errlen);
}

/*
 * Drops the statements s prepared on a session that goes on with other
 * stores. Its names (led by its tag, which no later store of the session
 * gets) are never run again, and a source set aside and tried again at
 * each backoff, or let go and found again, opens a store of a new tag
 * each time: left prepared, each try's statements stayed in the server
 * session's memory for the session's life. Pooled, the names are the
 * pool's (STORE_POOLED_PREFIX), no store's own. Best effort, outside a
 * transaction only: a failure leaves them as before. The session's first
 * store (no tag) leaves its own, once a session: its names are the
 * session's first and shortest. A store that prepared nothing on this
 * connection costs no round trip.
 */
static void forget_statements(struct store *s)
{
	PGconn *c = s->ses->conn;
	bool any = false;
	for (int i = 0; i < ST_COUNT; i++)
		any |= s->prepared[i];
	for (size_t i = 0; i < sizeof(s->tx_prepared) / sizeof(*s->tx_prepared);
	     i++)
		any |= s->tx_prepared[i];
	if (!any || s->prepared_gen != s->ses->conn_gen || !s->tag[0] || !c ||
	    PQstatus(c) != CONNECTION_OK ||
	    PQpipelineStatus(c) != PQ_PIPELINE_OFF ||
	    PQtransactionStatus(c) != PQTRANS_IDLE || store_pooled(s))
		return;
	char like[40];
	size_t n = strlen(s->tag) - 1; /* the tag's '_', escaped below */
	snprintf(like, sizeof(like), "%.*s\\_%%", (int)n, s->tag);
	const char *values[1] = {like};
	PGresult *res = PQexecParams(
	    c,
	    "SELECT string_agg(format('DEALLOCATE %I', name), '; ') FROM "
	    "pg_prepared_statements WHERE name LIKE $1",
	    1, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 &&
	    !PQgetisnull(res, 0, 0))
		PQclear(PQexec(c, PQgetvalue(res, 0, 0)));
	PQclear(res);
}

void store_close(struct store *s)
{
	if (!s)
		return;
	if (s->ses->leasing == s && s->ses->users > 1) {
		/* The session goes on with the other stores: none of them
		 * may find this store's lease transaction open on it. */
		char why[256];
		store_lease_end(s, TX_ROLLBACK, why, sizeof(why));
	}
	if (s->ses->users > 1)
		forget_statements(s);
	store_close(s->claim);
	session_put(s->ses);
	for (int i = 0; i < ST_COUNT; i++)
		free(s->sql[i]);
	free(s->conninfo);
	free(s->app_name);
	free(s->leased_by);
	free(s->ce_source);
	free(s->extra_sql);
	store_paused_keys_free(s);
	free(s->key_cursor);
	key_map_clear(s);
	free(s->claim_key);
	for (size_t i = 0; i < sizeof(s->tx_settings) / sizeof(*s->tx_settings);
	     i++)
		free(s->tx_settings[i]);
	free(s->lease_probe_sql);
	free(s->pool_have);
	free(s);
}

int store_reconnect(struct store *s, char *err, size_t errlen)
{
	/* A table that fails its check leaves the session to the others of
	 * it: s's own statements check again first, and fail with why. */
	return connect_session(s, err, errlen);
}

PGconn *store_conn(struct store *s)
{
	return s->ses->conn;
}

PGconn *store_claim_conn(struct store *s)
{
	return s->claim ? s->claim->ses->conn : NULL;
}

void store_on_partitions_listed(struct store *s, void (*fn)(void *arg),
				void *arg)
{
	s->partitions_listed = fn;
	s->partitions_listed_arg = arg;
}

void store_on_ahead_drop_try(struct store *s,
			     void (*fn)(void *arg, int attempt), void *arg)
{
	s->ahead_drop_try = fn;
	s->ahead_drop_try_arg = arg;
}

void store_set_key_walk_cap(struct store *s, size_t keys)
{
	s->key_walk_cap = keys < 1 ? 1 : keys;
	free(s->sql[ST_LEASE]);
	free(s->sql[ST_LEASE_BARE]);
	s->sql[ST_LEASE] = s->sql[ST_LEASE_BARE] = NULL;
}

void store_channel_sql(const struct outbox_table *t, char *out, size_t outlen)
{
	/* Hashed from the schema-qualified name, so outbox tables of one
	 * name in different schemas do not wake each other's relays. */
	snprintf(out, outlen, "'outbox_wakeup_' || hashtext(%s)", t->literal);
}
