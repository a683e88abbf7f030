/* SPDX-License-Identifier: MIT */
/*
 * Inside the store: the struct store every file of src/store/ shares, the
 * statement ids, and the helpers that run them. Never included outside
 * src/store/ (tests of the store excepted).
 *
 * Ownership: struct store owns its copies of the option strings and every
 * statement text in sql[], and holds one reference to its session (struct
 * store_session), which the stores of one thread that name tables of one
 * database share (store_open_sharing()); store_close() frees what the
 * store owns and the session with its last reference.
 */
#ifndef OUTBOX_STORE_INTERNAL_H
#define OUTBOX_STORE_INTERNAL_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/base.h"
#include "store.h"

enum stmt {
	ST_LEASE,
	ST_LEASE_BARE,	/* without the claims table */
	ST_CLAIM,	/* on the claim session */
	ST_CLAIM_RENEW, /* on the claim session */
	ST_KEEPALIVE,
	ST_SENT,
	ST_SENT_DELETE,
	ST_RETRY,
	ST_TRANSPORT,
	ST_FAILED,
	ST_XACT_STATUS,
	ST_SWEEP_CLAIMS,
	ST_SETTLE_OWN, /* on the claim session */
	ST_SWEEP,
	ST_PRUNE_CLAIMS,
	ST_CLEAN_SENT,
	ST_CLEAN_FAILED,
	ST_CLEAN_SENT_DEFAULT,
	ST_CLEAN_FAILED_DEFAULT,
	ST_NEXT_DUE,
	ST_REDRIVE_FAILED,
	ST_REDRIVE_SENT,
	ST_COUNT_FAILED,
	ST_COUNT_SENT,
	ST_SPAN_SENT,
	ST_CONTROL,
	ST_REDRIVE_CHECK_SENT,
	ST_REDRIVE_CHECK_FAILED,
	ST_UNBLOCK,
	ST_UNBLOCK_SKIP,
	ST_UNBLOCK_REDRIVE,
	ST_VERSION,
	ST_REDRIVE_RECHECK,
	ST_FAIL_REFUSED,
	ST_CLAIM_RELEASE, /* on the claim session */
	ST_KEY_MAP,
	ST_COUNT
};

/* How a transaction ends. */
enum tx_end { TX_COMMIT, TX_ROLLBACK };

/*
 * Internal only, never returned by a public function: a serialization
 * failure or deadlock, so the statement may run again.
 */
#define STORE_RETRY_STATEMENT (-100)

#define SWEEP_BATCH 500

/*
 * The status of a claim's lease transaction (x: its xid8 column) as SQL,
 * NULL for a claim from another cluster or from before a restore
 * (docs/design.md §4, "Claims from elsewhere"). pg_xact_status() raises
 * 22023 for an xid this cluster has not reached yet, and a claim carried
 * in by pg_dump, logical replication or a blue-green upgrade may hold one.
 * A claim written here is visible only once the transaction that wrote it
 * committed, and that transaction began after its lease transaction had
 * its xid: so every claim of this cluster a snapshot sees has an xid below
 * the snapshot's xmax, and one at or past it cannot be running here. CASE,
 * so pg_xact_status() never sees such an xid; the scalar subquery is
 * computed once per statement. NULL reads as pg_xact_status() reads an xid
 * too old to know: never in progress, never aborted.
 */
#define CLAIM_XACT_HORIZON "(SELECT pg_snapshot_xmax(pg_current_snapshot()))"
#define CLAIM_XACT_STATUS(x)                                                   \
	"(CASE WHEN " x " < " CLAIM_XACT_HORIZON " THEN pg_xact_status(" x     \
	") END)"
/* The lease's claim floor, $5 (statements.c): past the cluster's next
 * transaction id it cannot be this cluster's, and every claim is read. */
#define CLAIMS_FLOOR                                                           \
	"(CASE WHEN $5::xid8 <= pg_snapshot_xmax(pg_current_snapshot()) THEN " \
	"$5::xid8 ELSE '0'::xid8 END)"
/* The lease's late-scan floor, $6 (statements.c): NULL skips the scan; a
 * floor past the cluster's next transaction id (a database restored under
 * a running relay) reads every row that has a writer. */
#define WRITTEN_FLOOR                                                          \
	"(CASE WHEN $6::xid8 > pg_snapshot_xmax(pg_current_snapshot()) THEN "  \
	"'0'::xid8 ELSE $6::xid8 END)"
/* The scans by writer read no row written by a transaction past the
 * snapshot's xmax: a row any snapshot can see was written below it, and
 * a row of a restored copy, written_by of another cluster's counter,
 * lies past it until this cluster's counter gets there. Such rows are
 * found as rows without a writer are, by rescans and key-map builds;
 * read by writer, every lease read all of them again (a key-map lease
 * folded each into its discovery, its cost the backlog's size). */
#define WRITTEN_HERE "written_by < pg_snapshot_xmax(pg_current_snapshot())"
/* The rows of t whose id lies between the least and the greatest id of
 * column col of from: what lets a generic plan prune the partitions of a
 * table partitioned by id when it runs (statements.c, the marks). uuid
 * has no min() or max() in Postgres 15. */
#define ROW_ID_RANGE(col, from)                                                \
	" AND t.id >= (SELECT " col " FROM " from " ORDER BY " col             \
	" LIMIT 1) AND t.id <= (SELECT " col " FROM " from " ORDER BY " col    \
	" DESC LIMIT 1)"

#define REDRIVE_BATCH 1000
/* Keys one ordered lease's walk steps to at most (statements_lease.c). */
#define KEY_WALK_CAP 10000

/*
 * One Postgres session and what lives on it rather than on a store: its
 * connection and generation, what it has prepared of the transactions'
 * settings (the same text for every store of it, all from one config),
 * and its one open lease transaction. Each store on it prepares its own
 * statements under names of its own (struct store's tag). Used by one
 * thread, like its stores; freed with its last reference (users).
 */
struct store_session {
	PGconn *conn;
	uint64_t conn_gen; /* bumped by every (re)connect */
	/* The lock lease (docs/design.md §4): the store whose lease
	 * transaction is open on this session; NULL when none is. */
	const struct store *leasing;
	int users;     /* stores holding a reference */
	unsigned tags; /* statement-name prefixes handed out */
	/* The claim session its stores' claim stores share (lease.c), with
	 * a reference of this session's; NULL before the first claim. */
	struct store_session *claim;
	/* How long a statement's reply may take (0: as long as it takes),
	 * and whether the last one's did not come in time, which closed
	 * the connection (run.c). A claim session's statements run while
	 * the lease's own session holds a pooler's server connection, and
	 * wait for another (lease.c). When on_late is set, the first
	 * deadline calls it once (with on_late_arg) instead, and the reply
	 * may then take reply_wait_after_ms more. */
	int64_t reply_wait_ms;
	int64_t reply_wait_after_ms;
	void (*on_late)(void *arg);
	void *on_late_arg;
	bool reply_late;
	/* The SQLSTATE of the last statement that failed with one ("" when
	 * none did), set by the runner (run.c). */
	char failed_state[6];
	/* Whether the server said it ends the connection (a FATAL between
	 * statements, heard by pgconn_hear()); reset by every connect. */
	bool server_ended;
};

/* The highest seq among the table's newest rows by id (%s: the table,
 * quoted), on its primary key: where a row past seq's sequence shows on a
 * copy that did not bring the sequence along (docs/design.md §6). migrate
 * moves the sequence past it; an ordered relay refuses the table. */
#define SQL_NEWEST_SEQ                                                         \
	"(SELECT max(seq) FROM (SELECT seq FROM %s ORDER BY id DESC LIMIT "    \
	"100) n)"

/* The name a statement is prepared under (stmt_name.c), hash the
 * store_text_hash() of its text: pooled (tag NULL), STORE_POOLED_PREFIX
 * and the hash; otherwise tag, what (the statement's kind) and the hash.
 * A store hashes each text once, as it builds it (sql_hash, tx_hash). */
struct stmt_name {
	char text[64];
};
struct stmt_name store_stmt_name(const char *tag, const char *what,
				 uint64_t hash);
uint64_t store_text_hash(const char *sql);

/* OUTBOX_PG_PREPARE=pooled: a statement's name is this prefix and 16 hex
 * digits of a hash of its text, so a name on a server connection means
 * one text whichever relay, table or store prepared it (run.c), and the
 * names the probe reads, each followed by a space. */
#define STORE_POOLED_PREFIX "outbox_p_"
#define STORE_POOLED_PROBE                                                     \
	"(SELECT string_agg(name || ' ', '') FROM pg_prepared_statements "     \
	"WHERE name LIKE 'outbox\\_p\\_%')"

struct store {
	struct store_options opt;
	/* This store's statements' names are store_stmt_names[] led by
	 * tag, "" for the session's first store, so two tables' statements
	 * never share a name on one session. */
	char tag[16];
	/* The session generation prepared[] belongs to. */
	uint64_t prepared_gen;
	/* The generation in which the table passed its check (exists, at
	 * the schema version, side tables read): a store checks again before
	 * its first statement on a new connection of its session. */
	uint64_t checked_gen;
	bool checking; /* the check's own statements are running */
	/* Ordered mode could not read seq's sequence, and said so once. */
	bool seq_unchecked_said;
	struct outbox_table table;
	char *conninfo;
	char *app_name;
	char *leased_by;
	char *ce_source;
	char *extra_sql;   /* test hook (store_test.h); NULL otherwise */
	char blocked[160]; /* the blocked-keys table, quoted */
	char claims[160];  /* the claims table, quoted */
	struct store_session *ses;
	/* The rows of the lease transaction this store opened on its
	 * session, for the marks' ctids; set by store_lease, cleared when
	 * the batch goes. */
	const struct lease_rows *open_lease;
	/* A mark of open_lease failed before it reached the server (out of
	 * memory, a row not of the lease), leaving the transaction
	 * healthy: store_lease_commit() rolls it back instead, as the
	 * server does after a failed mark, so no outcome of the batch takes
	 * effect and the sweeper charges its handed-over rows. */
	bool open_lease_failed;
	/* The store that records this one's claims, on the claim session
	 * (opened on the first lease; NULL for stores that lease
	 * nothing). */
	struct store *claim;
	/* The table has no claims table (made by hand, not by migrate):
	 * leases go on without claims, so a crash charges no attempt. */
	bool claims_missing;
	/* The open lease was rolled back while its claim waited for its
	 * reply (lease.c, give_lease_up()), after claim_waited_ms. */
	bool lease_given_up;
	int64_t claim_waited_ms;
	/* A table made partitioned by migrate --partition, seen by
	 * store_partitions_tend(): store_clean() deletes in its default
	 * partition only. */
	bool clean_default;
	/* Test hook (store_test.h): called as store_partitions_tend() has
	 * listed the days past retention, before it drops any. */
	void (*partitions_listed)(void *arg);
	void *partitions_listed_arg;
	/* Test hook (store_test.h): called before each try to drop the
	 * check of the days ahead that were not made, with the try's
	 * number. */
	void (*ahead_drop_try)(void *arg, int attempt);
	void *ahead_drop_try_arg;
	/* The connection (its conn_gen; 0, which none has, for none)
	 * whose role was refused pg_notification_queue_usage() (revoked
	 * from PUBLIC): the gauge query goes on without it there, and asks
	 * again on the next connection, after which a grant may have come. */
	uint64_t notify_denied_gen;
	/* The table has no control table: ST_CONTROL reads no pauses. */
	bool control_off;
	char *sql[ST_COUNT];	     /* NULL until first used (store_sql) */
	uint64_t sql_hash[ST_COUNT]; /* of sql[st], set with it */
	bool prepared[ST_COUNT];
	/* Each kind of transaction's settings (tx_settings), prepared as
	 * the statements are, by this store: another store of the session
	 * may have other settings. */
	bool tx_prepared[4];
	/* conn_gen of the session that failed the rows the destination
	 * CHECK refuses before its first ordered lease (lease.c). */
	uint64_t refused_gen;
	/* The settings each kind of transaction opens with, by enum
	 * pgconn_tx (pgconn.h): the session itself carries none, so behind
	 * a transaction-mode pooler each transaction has what it needs and
	 * leaves nothing behind. */
	char *tx_settings[4];
	uint64_t tx_hash[4]; /* of tx_settings[tx] */
	/* OUTBOX_PG_PREPARE=pooled (run.c): the lease transaction's
	 * settings that also ask which of the relay's statements its
	 * server connection has prepared, and, while that transaction is
	 * open, their names (those it prepared since, too), each followed
	 * by a space. */
	char *lease_probe_sql;
	char *pool_have;
	/* Pooled, a statement outside any transaction runs by name, or is
	 * prepared first where it last had to be (run.c). */
	bool pool_parse[ST_COUNT];
	/* The lease's scan floor (lease.c): where this session's next due
	 * scan starts, the lowest (next_attempt_at, seq) of its previous
	 * batch, the due scan's key (next_attempt_at in microseconds since
	 * 2000, Postgres' epoch), unless a rescan is due
	 * (clock_ms() past rescan_at_ms, or the paused list changed from
	 * rescan_paused_keys) or floor_gen is not the session's conn_gen.
	 * floor_gen: the conn_gen of the session that returned the floor (0:
	 * none yet; a connected session's is at least 1). After a reconnect the
	 * next lease scans from the start, since what ended the session (a
	 * restore, a failover) may have made rows pending again below this
	 * floor and the late scan's. */
	int64_t floor_us;
	int64_t floor_seq;
	uint64_t floor_gen;
	int64_t rescan_at_ms;
	unsigned rescans_failed; /* scheduled rescans that failed (tests) */
	/* The paused destinations' list last seen, NULL before the first:
	 * a pause lifted since makes its rows due (a rescan), one added
	 * makes none. */
	char **rescan_paused_keys;
	size_t rescan_paused_n;
	/* The claim floor (lease.c): a transaction id below which every
	 * claim is settled, returned by this session's last lease; 0 reads
	 * every claim, as at the first lease, after a reconnect (claims_gen
	 * differs from conn_gen) and once claims_rescan_at_ms passes. */
	uint64_t claims_floor;
	uint64_t claims_gen;
	int64_t claims_rescan_at_ms;
	/* The late scan's floor, the lease's $6 (lease.c): a transaction id
	 * at or below the writer of every row this session's last lease
	 * could not see, returned by that lease (0: none yet). scan_from_us
	 * and scan_from_seq are the floor the open lease ran with (INT64_MIN
	 * for a rescan): rows below it came from the late scan and do not
	 * move the scan floor.
	 * written_missing: the table has no written_by column (made by
	 * hand), so no late scan, and rows below the floor wait for a
	 * rescan. */
	uint64_t written_floor;
	int64_t scan_from_us;
	int64_t scan_from_seq;
	bool written_missing;
	/* The table has no relay_source column (made by hand before
	 * migration 009): the marks pin the source into source. */
	bool relay_source_missing;
	/* Ordered mode's key walk: the last key this session's previous
	 * keyed lease took, where the next walk starts (statements_lease.c,
	 * $7; with the key map, its window, key_map.c); owned, NULL: from
	 * the first key. */
	char *key_cursor;
	/* At most this many keys a keyed lease's walk steps to
	 * (KEY_WALK_CAP; store_set_key_walk_cap in tests). */
	size_t key_walk_cap;
	/* Ordered mode's key map (key_map.c; statements_lease.c, $7-$10):
	 * every key with a live row as this session saw it, sorted by
	 * key, with its floor (owned); how many of them a lease walks at
	 * most (key_window); the discovery floor, a transaction id at or
	 * below the writer of every row the previous lease could not see;
	 * the connection generation it was built on and when the next
	 * build is due. key_map_built false: built before the next lease. */
	struct key_floor *key_map;
	size_t key_map_n;
	size_t key_window;
	size_t key_window_used; /* by the open lease; 0: the whole map */
	uint64_t key_map_disc;
	uint64_t key_map_gen;
	/* The shared key turn's gen as this store's latest lease began
	 * (opt.key_turn), and how many of its floors' moves this store has
	 * read. */
	uint64_t key_turn_gen;
	uint64_t key_passes_read;
	/* The shared due turn (opt.due_turn, due_turn.c): its gen as this
	 * store's latest lease began; whether that lease took rows and has
	 * not ended yet, the lowest key of any of them, and whether it let
	 * rows go that the turn may have passed (a release, a retry: the
	 * marks say so; rows cut by the byte budget), and the late floor
	 * it returned if it cut late rows (UINT64_MAX: none). */
	uint64_t due_turn_gen;
	bool due_turn_used; /* that lease started at the turn */
	bool due_turn_open;
	bool due_turn_let_go;
	int64_t due_turn_low_us;
	int64_t due_turn_low_seq;
	uint64_t due_turn_floor;
	int64_t key_map_at_ms;
	unsigned key_map_builds_failed; /* scheduled builds that failed */
	bool key_map_built;
	/* The backlog count's floors (store_admin.c): the oldest
	 * next_attempt_at the previous count found, as Postgres wrote it
	 * ("" until a count from the start), the xmin of its snapshot, and
	 * when the next count from the start is due. */
	char gauge_floor[64];
	uint64_t gauge_written;
	int64_t gauge_full_at_ms;
	uint64_t gauge_gen; /* conn_gen of the session the floors came from */
	/* This worker's latest claim, holder#xid (NULL before its first):
	 * the one its renewals and releases move and its next claim
	 * replaces. */
	char *claim_key;
};

/* A leased batch's rows: the result they point into, the events, and
 * the lease transaction they belong to. */
/* Text the relay makes of a leased row's binary columns. */
struct lease_text {
	char id[37];   /* uuid */
	char time[40]; /* created_at, RFC 3339 UTC */
	char tid[24];  /* ctid, "(block,offset)": where the locked row is */
	bool finished; /* marked sent or failed by the open lease */
	/* Ordered mode with the key map: the floor the lease's window read
	 * the row's key from (-1: not in the window). */
	int64_t from;
};
/* Row id of rows (its text: where it is, whether its marks finished it),
 * or NULL when rows has no such row (mark.c). rows->events are sorted by
 * seq, rows->text is in the result's order: an event's text is found by
 * its id. */
struct lease_text *lease_row_of(const struct lease_rows *rows, const char *id);

struct lease_rows {
	PGresult *res;
	struct lease_text *text; /* one per row of res, in its order */
	size_t n;
	struct store *s;   /* whose session holds the transaction */
	uint64_t conn_gen; /* that session's generation at the lease */
	char xid[24];	   /* the transaction, pg_current_xact_id() */
	char lease_id[37]; /* recorded on the rows its marks charge */
	struct outbox_event events[];
};

/* due_turn.c (docs/design.md §4, "The due turn"), for unordered leases
 * on a store with opt.due_turn. due_turn_begin(), as a lease starts:
 * notes the turn's gen; false for a rescan, in ordered mode or without a
 * turn, else sets *at_us, *seq and *written_floor to the turn's, where
 * the lease starts. due_turn_taken(), once its rows are read: a rescan
 * sets the turn to the last due row it took (reach, none if found_due
 * is false) and the late scan's floor written_floor, when no move back
 * came while it ran (else no turn); any other lease that started at the
 * turn moves it on to reach if it began under this turn's gen. low: the
 * lowest key of every row it took (n of them), cut: the byte budget may
 * have cut the batch. due_turn_ended(), after its COMMIT or ROLLBACK:
 * moves the turn back to low unless the lease committed (committed)
 * with nothing let go. due_key_below(): whether (at, seq) comes before
 * (at2, seq2) in the due scan's order. */
static inline bool due_key_below(int64_t at, int64_t seq, int64_t at2,
				 int64_t seq2)
{
	return at < at2 || (at == at2 && seq < seq2);
}
struct due_taken {
	size_t n;
	bool rescan, found_due, cut, written_floor_ok;
	int64_t reach_us, reach_seq, low_us, low_seq;
	uint64_t written_floor;
};
bool due_turn_begin(struct store *s, bool rescan, int64_t *at_us, int64_t *seq,
		    uint64_t *written_floor);
void due_turn_taken(struct store *s, const struct due_taken *d);
void due_turn_ended(struct store *s, bool committed);

/* lease.c, for the store's tests (store_test.h, which the relay does not
 * include): ends the lease keeping its claim, as a lease lost after the
 * hand-over. */
int store_lease_rollback_charged(struct store *s, struct lease_batch *b,
				 char *err, size_t errlen);

/* lease.c: takes ids[] (NULL: all) out of the claim of lease lease_id, on
 * the claim session, committed. */
int store_claim_release(struct store *s, const char *lease_id,
			const char *const *ids, size_t n, char *err,
			size_t errlen);

/* statements_ops.c: the texts of the operator commands' statements
 * (redrive, unblock, pauses, the schema version) and of ordered mode's
 * head keeping, for store_build_statements(). Each returns a malloc'd
 * text, NULL when out of memory. */
char *sql_redrive_failed(const struct store *s);
/* statements_lease.c: the lease statement, with and without claims. */
char *sql_lease(const struct store *s);
char *sql_lease_bare(const struct store *s);
char *sql_key_map(const struct store *s);
/* statements.c: whether a mark that may fail rows (may_fail) reads back
 * what it moved (ordered mode under block records the failed rows' keys
 * in the same statement), so its count comes as a row. */
bool store_mark_has_tail(const struct store *s, bool may_fail);
/* The SQL condition that no blocking row of a row's key (PK) comes before
 * the row (SQ, its seq), with %1$s the blocked-keys table and %2$s the
 * outbox table (docs/design.md §6, "Blocking"): a blocking row gone from
 * the table stops the whole key. The blocked keys are few, and under skip
 * none: whether there is any is asked once, and only then each row's key
 * (a probe of the blocked keys' index per candidate was some 15 % of the
 * ordered lease's buffer reads). */
#define NOT_BLOCKED_BEFORE(PK, SQ)                                             \
	"(NOT EXISTS (SELECT 1 FROM %1$s nb) OR NOT EXISTS (SELECT 1 FROM "    \
	"%1$s b WHERE b.partition_key = " PK " AND coalesce((SELECT x.seq "    \
	"FROM %2$s x WHERE x.id = b.blocking_id), -1) < " SQ "))"

/* statements.c: the CTE, after a "done" CTE returning MARK_COLUMNS' rows,
 * that blocks the key of each row of done that failed (the SQL condition
 * failed on d), at the earliest: a key blocked at a later row (an old row
 * the destination CHECK refused, failed ahead of its turn) is blocked
 * again at the earlier one, and only one row of a key is recorded. */
char *store_block_tail(const struct store *s, const char *failed);
char *sql_redrive_sent(const struct store *s);
char *sql_count_failed(const struct store *s);
char *sql_count_sent(const struct store *s);
char *sql_control(const struct store *s);
char *sql_redrive_check_sent(const struct store *s);
char *sql_span_sent(const struct store *s);
char *sql_redrive_check_failed(const struct store *s);
char *sql_redrive_recheck(const struct store *s);
char *sql_fail_refused(const struct store *s);
char *sql_unblock(const struct store *s);
char *sql_unblock_skip(const struct store *s);
char *sql_unblock_redrive(const struct store *s);
char *sql_version(const struct store *s);

/* lease_rows.c: whether res is an ordered lease that picked no row (its
 * one row carries the key walk's place, which it keeps). */
bool store_lease_found_none(struct store *s, const PGresult *res);
/* An integer column in binary form (network byte order) of width bytes:
 * false when NULL or of another width (lease_rows.c). */
bool store_col_be(const PGresult *res, int row, int c, int width,
		  uint64_t *out);
/* Whether ordered mode leases by the key map (statements_lease.c): it
 * needs written_by to learn of new keys, and keeps floors, which
 * OUTBOX_LEASE_RESCAN_INTERVAL=0 turns off; otherwise each lease walks
 * key_idx from the first key. */
static inline bool store_key_map_on(const struct store *s)
{
	return s->opt.ordered && !s->written_missing &&
	       s->opt.lease_rescan_ms > 0;
}
/* The lease statement's parameters but the last, the scan floor's seq
 * ($7 unordered, $8 ordered, $12 with the key map; lease.c,
 * statements_lease.c). */
static inline int store_lease_params(const struct store *s)
{
	return store_key_map_on(s) ? 11 : s->opt.ordered ? 7 : 6;
}
/* key_map.c. A key of the map and the seq below which it had no live
 * row; and, for the bound of its next descent (key_map_bound), the seq of
 * the finished row its floor last moved past (0: none since the walk
 * last read the key), the spacing from it to the next live row the walk
 * found last (0: none seen), and the larger of the last two such (0:
 * fewer than two seen). The spacings outlive the map's builds. */
struct key_floor {
	char *key;
	int64_t floor;
	int64_t passed;
	int64_t spacing;
	int64_t gap;
};
void key_map_clear(struct store *s);
/* The map as the build returned it: text[] and int8[] columns of row 0,
 * in binary. -1 when they are not that, or out of memory. */
int key_map_replace(struct store *s, const PGresult *res, int keys, int floors);
/* Merges what a lease returned (row 0, binary): the keys walked with
 * their new floors (NULL drops the key), and the keys discovered but
 * not walked, whose floors only go down; *walked is how many keys it
 * walked. -1 as above. */
int key_map_merge(struct store *s, const PGresult *res, int walked_keys,
		  int walked_floors, int found_keys, int found_floors,
		  size_t *walked);
/* After rows' lease committed: a key whose first live row (its floor)
 * the lease finished has its floor moved past that row, and the move is
 * shared with the process's other stores (opt.key_turn), which make it
 * at their next lease where it is safe. */
void key_map_passed(struct store *s, const struct lease_rows *rows);
/* Before a lease's merge: each keyed row's key's floor in the window the
 * lease read, for the move its finish shares. */
void key_map_note_from(struct store *s, struct lease_rows *rows);
/* What an ordered lease with the key map takes ($7-$11): the window of
 * the map it walks (at most key_window keys from the first past the
 * cursor, round from the first) as array literals, whether that is the
 * whole map, the discovery floor, and each key's bound. key_map_args
 * builds the map first when it is due; 0, or an error with err set. */
struct key_map_args {
	char *keys, *floors, *bounds; /* malloc'd */
	char disc[24];
	bool whole;
};
int key_map_args(struct store *s, int64_t now_ms, struct key_map_args *a,
		 char *err, size_t errlen);
void key_map_args_free(struct key_map_args *a);
/* After a lease with the key map: the shared key turn (store.h) moves to
 * where this store's walk ended, if no lease began since this one did. */
void key_map_turn_taken(struct store *s);
/* lease_rows.c: takes the lease statement's rows out of res into out (out
 * owns res from then on; out of memory, res is cleared) and sets the
 * session's scan and claim floors from them; 0, or STORE_ERROR with
 * err. */
int store_take_rows(struct store *s, PGresult *res, struct lease_batch *out,
		    char *err, size_t errlen);
/* A time in microseconds since 2000-01-01 (a scan floor, a redrive
 * slice's bound) as a timestamptz literal; false when the year cannot be
 * written (an infinite next_attempt_at, a finished_at made by hand). */
bool store_floor_text(int64_t pg_us, char out[40]);

/* A scan from the start of the pending index (a rescan, the backlog count
 * from the start) costs more the longer a snapshot is held (every dead
 * entry since it was taken): spaced to this many times its duration, it
 * takes at most about 0.1 % of a session's time. 20 (5 %) left the
 * rescans the largest part of a 10-minute hold's cost, and 100 (1 %)
 * still a tenth of it (docs/benchmark.md, "A held snapshot"). What waits
 * for one during such a hold is only a row with no writer (written
 * before migration 007, or put back by hand) or one a relay let go and
 * never leased again: the late scan finds the rest. */
#define RESCAN_COST_FACTOR 1000

/* The longest RESCAN_COST_FACTOR spaces a scan from the start: a row that
 * only such a scan finds waits no longer, whatever the last one took
 * (measured from the client: a lock or a pooler's wait counts too). A
 * rescan of 600 ms or more costs a little more than 0.1 % then, one
 * past a 10 s statement timeout at most 1.7 % of one session's time. */
#define RESCAN_PACE_MAX_MS (10 * 60 * 1000)

/* lease_floors.c: where a lease scans from. store_lease_rescans():
 * whether this lease rescans from the start (floor "-infinity"), else
 * floor (40 bytes) is the session's; lifted: a pause was lifted since the
 * list last seen. store_claims_floor_of(): the claims floor as the
 * lease's $5 (24 bytes), true for a full read. store_rescan_done(): a
 * rescan ended (or failed) after took_ms. store_paused_lifted() and
 * store_paused_added(): whether paused lacks a key of the list last seen,
 * or has one it lacked (the list may name a destination twice: an
 * operator's pause and the relay's own); store_paused_seen(): takes
 * paused as seen; store_paused_keys_free(): frees that list. */
bool store_lease_rescans(struct store *s, bool lifted, int64_t now_ms,
			 char floor[40]);
bool store_claims_floor_of(const struct store *s, int64_t now_ms, char out[24]);
void store_rescan_done(struct store *s, int64_t ended_ms, int64_t took_ms);
bool store_paused_lifted(const struct store *s, const char *const *paused,
			 size_t n);
bool store_paused_added(const struct store *s, const char *const *paused,
			size_t n);
void store_paused_seen(struct store *s, const char *const *paused, size_t n);
void store_paused_keys_free(struct store *s);

/* When the next scan from the start is due after one that ended at
 * ended_ms and took took_ms: OUTBOX_LEASE_RESCAN_INTERVAL later, or
 * RESCAN_COST_FACTOR times took_ms when that is longer, up to
 * RESCAN_PACE_MAX_MS. */
int64_t store_rescan_due(const struct store *s, int64_t ended_ms,
			 int64_t took_ms);

/* What a scan from the start that failed after took_ms counts as for its
 * spacing: took_ms when it was cancelled (57014: past the statement
 * timeout its walk is that long, and would be again at once; an
 * operator's cancel shares the code, and RESCAN_PACE_MAX_MS bounds it),
 * else 0, the interval (a lock timeout or a deadlock says nothing of its
 * walk: spaced by the wait, a lock timeout put the next one 83 minutes
 * off). */
int64_t store_failed_scan_took(const struct store *s, int64_t took_ms);

/* statements.c: the text of statement st, built into s->sql[] on first
 * use; NULL when out of memory. */
const char *store_sql(struct store *s, enum stmt st);
/* store_text_hash() of store_sql(s, st), hashed once as it was built. */
uint64_t store_sql_hash(struct store *s, enum stmt st);
/* ST_CONTROL's text for a table without a control table. */
#define STORE_NO_PAUSES_SQL "SELECT NULL::text AS destination WHERE false"
extern const char *const store_stmt_names[ST_COUNT];
/* True for the statements that run as PGCONN_TX_INDEXED outside a lease
 * transaction: reads of the queue, or of the claims table by holder,
 * that have one right plan through an index whatever their values. */
extern const bool store_stmt_indexed[ST_COUNT];

/* vasprintf that returns NULL when out of memory. */
char *store_asprintf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/*
 * Runs statement st. Returns the result (caller clears) when its status is
 * want; otherwise NULL with err set and *rc STORE_RECONNECT, STORE_ERROR
 * or STORE_RETRY_STATEMENT.
 */
PGresult *store_run(struct store *s, enum stmt st, int nparams,
		    const char *const *values, ExecStatusType want,
		    int result_format, int *rc, char *err, size_t errlen);

/*
 * Runs sql, an ad hoc statement (operator queries, the startup checks),
 * unprepared with text parameters, the way store_run() runs the
 * prepared ones: the result when its status is want, else NULL with *rc
 * and err set, err led by what. sql NULL means it could not be built
 * (out of memory).
 */
PGresult *store_exec(struct store *s, const char *what, const char *sql,
		     int nparams, const char *const *values,
		     ExecStatusType want, int *rc, char *err, size_t errlen);

/* prepare_mode.c: whether s runs its statements pooled (prepared once a
 * server connection, found by the lease transaction's probe), whether it
 * prepares the statement it runs now, the turn to pooled after a name
 * found missing or taken (26000, 42P05; why as worded, said once), and
 * what a failure that closed s's session says of the pool (a pool that
 * keeps each client's statements itself turns the process back to on). */
bool store_pooled(const struct store *s);
bool store_preparing(const struct store *s);
void store_stop_preparing(const char *why);
void store_notice_pool_keeps(const struct store *s, const PGresult *res,
			     const char *why);

/* OUTBOX_PG_PREPARE=on (prepare_mode.c): a session's server process (pid
 * server_pid) is not the one its connection announced (announced_pid), so
 * a pooler answered it: from now on every store of the process prepares
 * as with OUTBOX_PG_PREPARE=pooled, said once. */
void store_prepare_behind_pooler(long server_pid, int announced_pid);

/* prepare_mode.c: whether the process knows already how its statements reach
 * the server (a pooler seen or a statement refused, or a pool that keeps them):
 * a session connecting then need not ask (a claim session's reconnect runs
 * while its lease holds a server connection of the pool, and that question's
 * wait would have no bound). */
bool store_prepare_mode_known(void);

/* store_exec() of a statement run for its effect only; *rows (may be NULL)
 * counts the rows it changed. 0 or a public store_rc. */
int store_exec_cmd(struct store *s, const char *what, const char *sql,
		   int nparams, const char *const *values, size_t *rows,
		   char *err, size_t errlen);

/* What a failed store_run() means to a public caller. */
static inline int store_public_rc(int rc)
{
	return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
}

/* tables[] ("name" or "schema.name") as a Postgres text[] of quoted
 * names, as every statement names them (so to_regclass() keeps a
 * mixed-case name's case), with each one's claims and control tables
 * after it when with_side (activity.c); NULL with err on a bad name or
 * no memory. */
char *store_tables_array(const char *const *tables, size_t n, bool with_side,
			 char *err, size_t errlen);

/* How store_pg_array() writes its items. */
enum pg_array_form {
	PG_ARRAY_PLAIN,	 /* as they are: uuids, tids */
	PG_ARRAY_QUOTED, /* quoted and escaped: any text */
};

/*
 * A Postgres array literal: {a,b,c} (PG_ARRAY_PLAIN); {"x","y"} with
 * escapes (PG_ARRAY_QUOTED), each item cut to max_item bytes on a UTF-8
 * boundary. Malloc'd; NULL when out of memory.
 */
char *store_pg_array(const char *const *items, size_t n,
		     enum pg_array_form form, size_t max_item);

/* How a transaction's statements are planned. */
enum plan_mode {
	PLANS_AS_SET, /* the role's or database's plan_cache_mode */
	PLANS_CUSTOM, /* for their values, whatever that setting says */
	/* As a lease transaction's: generic, by index, without sorts
	 * (pgconn.c says why). */
	PLANS_INDEXED,
};

/* BEGIN; try the transaction-level advisory lock of ns for the table. */
int store_begin_locked(struct store *s, int ns, enum plan_mode plans, bool *got,
		       char *err, size_t errlen);

/*
 * The lease transaction of s's session (docs/design.md §4).
 * store_run_leasing() opens it and runs statement st in it, in one round
 * trip (libpq's pipeline mode): BEGIN, the transaction's settings
 * (PGCONN_TX_LEASE), st's preparation when due, st. Returns as store_run() does
 * for st's result, or for the first statement that failed; s leases on its
 * session once the BEGIN succeeded, whatever came after it. store_lease_end()
 * ends it, COMMIT or ROLLBACK; of a COMMIT that Postgres turned into a rollback
 * (a statement of it had failed) it returns STORE_ERROR.
 */
PGresult *store_run_leasing(struct store *s, enum stmt st, int nparams,
			    const char *const *values, ExecStatusType want,
			    int result_format, int *rc, char *err,
			    size_t errlen);
int store_lease_end(struct store *s, enum tx_end end, char *err, size_t errlen);

/* Opens a store for opt->table on session ses (a new one when NULL,
 * connected then); session_sql (NULL: none) runs after a new connection's
 * settings. */
int store_open_on(struct store **out, const struct store_options *opt,
		  struct store_session *ses, const char *session_sql, char *err,
		  size_t errlen);

/* Checks s's table on a connection of its session that s has not
 * checked it on yet (store_reconnect() by another store of the session);
 * 0 at once when it has. */
int store_check_session(struct store *s, char *err, size_t errlen);

/* Opens a store; session_sql (NULL: none) runs after the session
 * settings (store_test.h's store_open_traced). */
int store_open_traced(struct store **out, const struct store_options *opt,
		      const char *session_sql, char *err, size_t errlen);

/* True when err (from store_run) says a relation does not exist. */
static inline bool store_err_undefined_table(const char *err)
{
	return strncmp(err, "42P01", 5) == 0;
}

/* After a statement that names the claims table failed with a relation
 * missing (store_err_undefined_table()), outside an aborted transaction:
 * true when the claims table is what is missing (a table made by hand:
 * leases go on without claims), false when it is there (the outbox
 * table itself was dropped, to be made again: claims must not be given
 * up for good) or the catalog could not be read. */
bool store_claims_table_gone(struct store *s);

/* Whether the claims table is there, as the catalog says now: 1 or 0, -1
 * when the catalog could not be read. */
int store_claims_table_there(struct store *s);

/*
 * refused.c: fails, with the reason, the rows the table's destination
 * CHECK refuses while it is NOT VALID (old rows, migration 004); *n counts
 * them. store_fail_refused_after(): after a statement failed with err,
 * true when a CHECK refused it (23514) and failing such rows changed
 * something, so the statement may run once more.
 */
int store_fail_refused(struct store *s, size_t *n, char *err, size_t errlen);
bool store_fail_refused_after(struct store *s, const char *err);

/* COMMIT or ROLLBACK the open transaction. */
int store_finish_tx(struct store *s, enum tx_end end, char *err, size_t errlen);

/*
 * The NOTIFY channel of the table as an SQL text expression: the one
 * place that names it (migration 002's trigger function and the
 * listener both use it).
 */
void store_channel_sql(const struct outbox_table *t, char *out, size_t outlen);

#endif
