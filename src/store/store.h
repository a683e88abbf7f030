/* SPDX-License-Identifier: MIT */
/*
 * The store: every SQL statement the relay runs against the outbox table
 * and its side tables lives in src/store/ and nowhere else
 * (docs/design.md §3, §4, §7). This header is all other parts see of it.
 *
 * One struct store owns one Postgres session and is used by one thread
 * (the rescan schedule and the key turn it may share with other stores
 * excepted, below).
 * Statements are autocommit, except: a lease, which opens a transaction
 * that holds its rows locked while they are published, takes their marks
 * and ends with store_lease_commit() or store_lease_abort() (the lock
 * lease, docs/design.md §4); and sweep and clean batches, which run in
 * their own short transaction under a transaction-level advisory lock.
 * The database clock (now()) is the only clock for leases, backoff,
 * sweeping and retention.
 *
 * Return values (enum store_rc): STORE_OK; STORE_RECONNECT when the
 * session is gone or read-only (the caller backs off and calls
 * store_reconnect()); STORE_REFUSED when an operation was refused as
 * unsafe and nothing changed; STORE_INVALID when Postgres could not read
 * an operator's argument; STORE_ERROR for anything else. err says what
 * failed whatever the value.
 */
#ifndef OUTBOX_STORE_H
#define OUTBOX_STORE_H

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/base.h"

enum store_rc {
	STORE_OK = 0,
	STORE_RECONNECT = -1,
	STORE_ERROR = -2,
	STORE_REFUSED = -3,
	STORE_INVALID = -4,
};

/* Longest last_error kept, in bytes (the column allows a little more). */
#define STORE_ERROR_MAX 1024

/*
 * The rescan schedule (docs/design.md §4, "A held snapshot") the leasing
 * stores of one process share: one rescan per OUTBOX_LEASE_RESCAN_INTERVAL
 * (or per RESCAN_COST_FACTOR times a rescan's duration, lease.c) for the
 * process, by whichever store leases first once it is due, instead of one
 * per store. A rescan reads the whole pending index, so one covers every
 * store's floor. Owned by whoever opens the stores, zeroed before the
 * first, and outlives them; the stores read and move it with atomics from
 * their own threads.
 */
struct store_rescan_pace {
	atomic_llong due_ms; /* clock_ms() from which the next one is due */
};

/* A key's floor moved past a row one of the stores finished, for the
 * others (docs/design.md §6, "The key map", *Shared moves*): the key
 * (owned), the floor its lease's window read the key from, the row's seq
 * and that lease's discovery floor. */
struct key_pass {
	char *key;
	int64_t from;
	int64_t seq;
	uint64_t written;
};
/* The newest KEY_PASSES moves are kept; a store further behind skips
 * the older ones, which only leaves its floors lower. */
#define KEY_PASSES 4096

/*
 * Ordered mode's turn among the keys (docs/design.md §6, "The key
 * turn"), which the leasing stores of one process and table share: the
 * key after which the next lease's walk of the key map begins. Each
 * store's own place put one relay's workers in a convoy, each lease
 * starting behind the keys the others had just taken and stepping over
 * their locked rows. A lease moves the turn to the key its batch will end
 * on as it begins, and to the key it did end on if no lease began in
 * between. It also carries the floors' moves past finished rows from
 * store to store. Owned by whoever opens the stores; store_key_turn_init()
 * before the first, store_key_turn_destroy() after the last. lock guards
 * every field, which the stores read and move from their own threads.
 */
struct store_key_turn {
	pthread_mutex_t lock;
	char *cursor; /* owned; NULL: from the first key */
	uint64_t gen; /* leases begun */
	/* A ring of KEY_PASSES, passes[n % size], allocated by the first
	 * move (ordered mode only); NULL before. */
	struct key_pass *passes;
	uint64_t n_passes; /* moves ever added */
};
int store_key_turn_init(struct store_key_turn *t);
void store_key_turn_destroy(struct store_key_turn *t);

/*
 * The unordered lease's turn among the due rows (docs/design.md §4, "The
 * due turn"), which the leasing stores of one process and table share:
 * the due scan's key (next_attempt_at, seq) the next lease starts at, and
 * the late scan's floor below it. Each store starting at its own previous
 * batch stepped over the rows every other lane of the relay held locked,
 * a lock attempt each. A lease that started at it moves it on to the
 * last due row it took, unless it ran under a turn moved back since it
 * began; a lease that let rows go without moving them on (released,
 * retried, rolled back, cut by the byte budget) moves it back to its
 * lowest row once they are free; a rescan sets it (none when it found no
 * row, or a move back came while it ran). Owned by whoever opens the
 * stores; store_due_turn_init() before the first,
 * store_due_turn_destroy() after the last. lock guards the rest, which
 * the stores read and move from their own threads.
 */
struct store_due_turn {
	pthread_mutex_t lock;
	int64_t at_us;		/* INT64_MIN: no turn, each store its own */
	int64_t seq;		/* with at_us, the due scan's key */
	uint64_t written_floor; /* the late scan's floor below the key */
	uint64_t gen;		/* moves back */
};
int store_due_turn_init(struct store_due_turn *t);
void store_due_turn_destroy(struct store_due_turn *t);

struct store_options {
	const char *conninfo;  /* NULL: libpq's PG* variables */
	const char *table;     /* "name" or "schema.name" */
	const char *app_name;  /* application_name of the session */
	const char *leased_by; /* host/pod, pid, worker; the store adds a
				  random instance (the claim's holder) */
	const char *ce_source; /* pinned into rows whose source is NULL */
	int batch_size;	       /* 1..10000, a literal in the lease text */
	int64_t batch_bytes;   /* payload bytes a lease stops adding rows
				  past; 0: no budget */
	int clean_batch_size;  /* rows per cleaner transaction */
	int64_t lease_timeout_ms;
	int64_t statement_timeout_ms;
	int64_t lease_rescan_ms; /* OUTBOX_LEASE_RESCAN_INTERVAL; 0: every
				    lease scans from the start */
	int64_t dead_peer_ms;	 /* OUTBOX_PG_DEAD_PEER_TIMEOUT; 0: 15 s */
	int64_t backoff_base_ms;
	int64_t backoff_max_ms;
	double backoff_factor;
	bool prepare; /* named prepared statements (off: unnamed) */
	/* Behind a transaction-mode pooler: each statement prepared once
	 * a server connection, which the lease transaction asks for as it
	 * opens and a statement outside a transaction tries by name; the
	 * other transactions' run unnamed (run.c). */
	bool prepare_pooled;
	bool ordered;		 /* OUTBOX_ORDERING=partition */
	bool block_on_failure;	 /* OUTBOX_ORDERING_ON_FAILURE=block */
	int64_t lock_timeout_ms; /* 0: half the statement timeout */
	bool delete_sent;	 /* OUTBOX_RETENTION=0: no history */
	/* Shared with the process's other stores; NULL: this store keeps
	 * a schedule of its own. */
	struct store_rescan_pace *rescan_pace;
	/* Shared likewise in ordered mode; NULL: this store's walk begins
	 * where its own previous lease ended. */
	struct store_key_turn *key_turn;
	/* Shared likewise in unordered mode; NULL: this store's due scan
	 * starts at its own previous batch. */
	struct store_due_turn *due_turn;
};

struct store;
struct config;

/*
 * The store options the settings imply, for a session named app_name
 * (application_name) whose leases say leased_by (NULL for sessions that
 * lease nothing). Strings are borrowed from cfg and the arguments.
 */
struct store_options store_options_from_config(const struct config *cfg,
					       const char *app_name,
					       const char *leased_by);

/* The rows of a lease, private to the store. */
struct lease_rows;

/*
 * A leased batch: rows locked by the lease transaction open on the
 * session that leased them (docs/design.md §4). Owns rows; every event
 * points into them. The session's caller ends the transaction with
 * store_lease_commit() or store_lease_abort(), then frees the batch with
 * lease_batch_release().
 */
struct lease_batch {
	struct lease_rows *rows;
	char lease_id[37];
	struct outbox_event *events;
	size_t n;
};

/* Frees b's rows. It ends no transaction: conclude the lease first. */
void lease_batch_release(struct lease_batch *b);

/* Which transition a mark performs; each is one statement per batch. */
enum mark_kind {
	MARK_SENT,	/* broker acknowledged */
	MARK_RETRY,	/* event class: backoff, failed when attempts spent */
	MARK_TRANSPORT, /* outcome unknown: backoff, charge kept, never
			   failed for it */
	MARK_FAILED,	/* permanent: failed at once */
	MARK_RELEASE,	/* never handed to the broker: pending, attempt back */
};

struct mark_result {
	size_t marked;	/* rows this call moved */
	size_t missing; /* rows named that were no longer pending: marked
			   already in this lease (a caller's mistake); no
			   other session can change them, the lease
			   transaction holds every row's lock */
};

struct sweep_result {
	size_t to_pending; /* returned as crash suspects */
	size_t to_failed;  /* attempts spent */
	bool skipped;	   /* another replica held the sweep lock */
	/* Claims from another cluster or from before a restore, dropped
	 * (docs/design.md §4). */
	size_t foreign_claims;
	/* What only a later sweep can settle: claims whose lease
	 * transaction was still running, plus 1 while rows of the row lease
	 * are in flight. 0 (with no write to the table or its claims since)
	 * means the next sweep would find nothing. */
	size_t open;
};

struct clean_result {
	size_t sent_deleted;
	size_t failed_deleted;
	bool skipped;
};

/*
 * Connects and checks the table exists (a missing one is an error naming
 * it and `outbox-relay migrate`). Returns 0 with *out set, or an error.
 */
int store_open(struct store **out, const struct store_options *opt, char *err,
	       size_t errlen);
void store_close(struct store *s);

/*
 * Like store_open(), on the session of with (a new one when with is
 * NULL): the stores of one thread that name tables of one database share
 * its sessions (docs/design.md §13), opt->conninfo then being with's. A
 * session holds at most one lease transaction, of whichever of its stores
 * leased; store_reconnect() of any of them reconnects it for all, and
 * each checks its table again before its next statement. The session
 * closes with its last store; stores of one session are used by one
 * thread.
 */
int store_open_sharing(struct store **out, const struct store_options *opt,
		       struct store *with, char *err, size_t errlen);

/* Drops the session and connects again; an open lease transaction ends
 * with it (its rows are pending again). */
int store_reconnect(struct store *s, char *err, size_t errlen);

/*
 * Opens the lease transaction of s's session and leases up to batch_size
 * due pending rows into it (at most one crash suspect), skipping rows
 * whose destination, or destination + chr(31) + routing key, is in
 * paused[] (n_paused may be 0). default_destination is what a NULL
 * exchange means. A non-empty batch leaves the transaction open, its rows
 * locked and its claim committed, until store_lease_commit() or
 * store_lease_abort(); an empty batch (n == 0, rows == NULL) and every
 * failure leave none open.
 */
int store_lease(struct store *s, const char *const *paused, size_t n_paused,
		const char *default_destination, struct lease_batch *out,
		char *err, size_t errlen);

/*
 * Concludes the lease of b, open on s: commits the marks written inside
 * its transaction, which releases every row left unmarked (docs/design.md
 * §4). 0 when committed. When the COMMIT's reply is lost with the
 * connection, reconnects and asks Postgres whether the transaction
 * committed. Otherwise nothing of the batch took effect: the rows are
 * pending again and the sweeper charges their attempt; STORE_RECONNECT
 * (session lost or transaction aborted) or STORE_ERROR, with err saying
 * which.
 */
int store_lease_commit(struct store *s, struct lease_batch *b, char *err,
		       size_t errlen);

/*
 * Ends the lease of b, open on s, before any of its rows was handed to the
 * broker: its claim gives up every row (committed, on the claim session),
 * then ROLLBACK. Every row is pending again as it was before the lease,
 * uncharged (docs/design.md §4); should the claim's update fail, the claim
 * keeps the rows and the sweeper charges their attempt. 0 when the
 * transaction is no longer open (also when it already ended with its
 * session).
 */
int store_lease_abort(struct store *s, struct lease_batch *b, char *err,
		      size_t errlen);

/*
 * Whether the lease of b is still open on s as far as s can tell without a
 * round trip: false once it ended, its session was reconnected, or the
 * server ended the session (killed, past the lease timeout: it says so
 * before closing the socket). A transaction lost without a word (a
 * network cut) shows only when a statement in it fails, such as
 * store_renew()'s. The caller hands no further row over once it is false.
 */
bool store_lease_held(struct store *s, const struct lease_batch *b);

/*
 * Keeps the lease transaction open on s alive: one statement in it, so
 * the session does not sit idle in transaction past the lease timeout
 * (which would end it and release the rows). The rows cannot be lost
 * while the transaction lives, so there is nothing per row to report.
 * Also moves the claim's expiry, which status shows. STORE_RECONNECT
 * when no lease transaction is open any more.
 */
int store_renew(struct store *s, char *err, size_t errlen);

/*
 * Applies mark kind to ids[] of the lease open on s, inside its
 * transaction: nothing takes effect before store_lease_commit().
 * reasons[] (NULL for MARK_SENT and MARK_RELEASE) become last_error, cut
 * to STORE_ERROR_MAX. MARK_RELEASE writes no row (the row's lock goes
 * with the transaction, and no attempt is charged): its ids leave the
 * lease's claim, committed, so a lease that aborts later does not have
 * them charged either (also when the lease already ended, which it still
 * reports as STORE_RECONNECT). A failed mark ends
 * the transaction (Postgres aborts it), and with it the whole batch; one
 * that failed before it was sent (a row not of the lease, out of memory)
 * makes store_lease_commit() roll the transaction back alike.
 */
int store_mark(struct store *s, enum mark_kind kind, const char *const *ids,
	       const char *const *reasons, size_t n, struct mark_result *r,
	       char *err, size_t errlen);

/* Sweeps expired leases in batches until none are left or max_rows. */
int store_sweep(struct store *s, size_t max_rows, struct sweep_result *r,
		char *err, size_t errlen);

/*
 * Deletes sent rows finished more than retention_ms ago and failed rows
 * finished more than failed_retention_ms ago (0 keeps them), in keyset
 * batches of clean_batch_size, each its own transaction, pausing pause_ms
 * between batches and stopping after max_rows.
 */
int store_clean(struct store *s, int64_t retention_ms,
		int64_t failed_retention_ms, size_t max_rows, int64_t pause_ms,
		struct clean_result *r, char *err, size_t errlen);

/* What store_partitions_tend() did. */
struct partition_result {
	bool partitioned; /* by migrate --partition: tended */
	size_t created;	  /* daily partitions made ahead */
	size_t dropped;	  /* daily partitions dropped */
	size_t carried;	  /* their rows not yet deletable, moved to the
			     default partition */
	size_t kept;	  /* days past retention kept: too many such rows */
	bool busy;	  /* a lock not had in time: the next round */
};

/*
 * On a table made partitioned by `migrate --partition` (docs/design.md
 * §11, "Partitions by the day"): makes a partition for each of the next
 * days_ahead days (UTC) that has none, and drops each daily partition
 * whose day ended more than retention_ms ago, first moving to the default
 * partition its rows that store_clean() would not delete now (pending or
 * in flight; sent within retention_ms; failed within failed_retention_ms,
 * or kept when 0; blocking a key). From then on store_clean() deletes the
 * default partition's rows only. Nothing on another table. Steps that
 * wait longer than 200 ms for a lock, or find the cleaner's lock held
 * (another replica tending, which may make fewer days ahead), are left
 * for the next call (r->busy), and so are the round's further drops
 * after one such wait. A day with more than 10,000 such rows to move
 * stays (r->kept) until fewer are left: they move under the table's lock.
 * The partitions take the default partition's storage parameters, with
 * fillfactor 50 when history is kept (retention_ms > 0).
 */
int store_partitions_tend(struct store *s, int days_ahead, int64_t retention_ms,
			  int64_t failed_retention_ms,
			  struct partition_result *r, char *err, size_t errlen);

/* How far a long operator command got (redrive, migrate's index builds). */
struct store_progress_info {
	const char *what;    /* "redrive", or the index being built */
	const char *phase;   /* migrate: pg_stat_progress_create_index.phase */
	int64_t done, total; /* rows, blocks or tuples; total 0: unknown */
	bool finished;	     /* migrate: the build ended (after reports) */
};

/*
 * A watcher of a long command: fn is called after each redrive batch, and
 * about every second while migrate builds an index. Returning false asks
 * redrive to stop before its next batch (the batches done stay done);
 * migrate ignores it (an interrupted build is dropped and redone by the
 * next run, §2).
 */
struct store_progress {
	bool (*fn)(void *ctx, const struct store_progress_info *p);
	void *ctx;
};

struct redrive_filter {
	const char *const *ids; /* n_ids == 0: any id */
	size_t n_ids;
	const char *type;  /* NULL: any type */
	const char *since; /* finished_at >= since (timestamptz text); NULL */
	const char *until; /* finished_at < until; NULL: no bound */
	bool sent;	   /* replay sent rows instead of failed ones */
	bool dry_run;	   /* count only */
	bool force;	   /* ordered mode: redrive even rows whose key
			      already has a later row sent (a later row held
			      by a lease is refused even so; STORE_REFUSED
			      otherwise) */
	/* Ordered mode: how long sent rows stay in the table
	 * (OUTBOX_RETENTION; 0: deleted as they are marked). A row finished
	 * longer ago than that may have later rows of its key delivered and
	 * deleted since, which no check can see: refused without force. */
	int64_t sent_kept_ms;
	const struct store_progress *progress; /* NULL: none */
	/* The matching rows are counted first, for the progress line's
	 * total: a count of a big range may take longer than the statement
	 * timeout allows, where each batch would not. */
	bool count_first;
};

/*
 * Returns matching failed (or, with sent, already-sent) rows to pending
 * with attempts reset, in batches of 1000 rows. *count is how many rows
 * moved (or would move, with dry_run). Ordered mode: each batch is its
 * own transaction and puts its rows in front of their keys' rows still
 * pending (the key's head is demoted); STORE_REFUSED, with that batch
 * unchanged, when a later row of a key is held by a lease, or (without
 * force) already sent.
 */
int store_redrive(struct store *s, const struct redrive_filter *f,
		  size_t *count, char *err, size_t errlen);

/* The size of a destination key the lease skips: a destination, or a
 * destination, chr(31) and a routing key (an AMQP exchange and routing
 * key are short strings, 255 bytes each). */
#define STORE_PAUSE_KEY_MAX (255 + 1 + 255 + 1)
/* The destination pauses a relay keeps; store_admin_pause() refuses one
 * more. */
#define STORE_MAX_PAUSES 256

/*
 * Reads the operator pauses (the control table): *global is set when all
 * leasing is paused; the paused destinations are written to keys[] (at
 * most max_keys) and counted in *n.
 */
int store_read_pauses(struct store *s, bool *global,
		      char (*keys)[STORE_PAUSE_KEY_MAX], size_t max_keys,
		      size_t *n, char *err, size_t errlen);

/*
 * Lifts the block of key: with redrive the failed blocking row returns to
 * pending, attempts reset, and goes first; without, it stays failed and
 * the key goes on from its next pending row (both also set the head
 * marker relays of earlier versions lease by). The key's next failed
 * row past the blocking one, if any (one failed ahead of its turn), then
 * blocks it, and on success err says so for the operator ("" else).
 * STORE_REFUSED when the key is not blocked.
 */
int store_unblock(struct store *s, const char *key, bool redrive, char *err,
		  size_t errlen);

/*
 * Milliseconds until the earliest pending row not yet due is due (at
 * least 1), or -1 when no pending row waits for a later time: rows due
 * already are the lease's business, not a reason to wake sooner.
 */
int store_next_due_ms(struct store *s, int64_t *ms, char *err, size_t errlen);
/* The same after a lease that began since_ms ago: a row that came due
 * since (which that lease could not see) is due now, 0. */
int store_next_due_since_ms(struct store *s, int64_t since_ms, int64_t *ms,
			    char *err, size_t errlen);

/*
 * For each of tables[] (each "name" or "schema.name" of s's database),
 * a count that moves whenever it, its claims table or its control table
 * is written (a new row, a mark, a redrive, a lease with rows, a release,
 * a pause or a resume) (Postgres'
 * cumulative statistics, flushed by each backend at most once a second),
 * -1 for a table that does not exist. One statement on s's
 * session, whatever the number of tables: what a relay of many tables
 * reads to learn which idle ones may have rows (docs/design.md §13).
 * STORE_REFUSED when the server counts nothing (track_counts off).
 */
int store_tables_activity(struct store *s, const char *const *tables, size_t n,
			  int64_t *counts, char *err, size_t errlen);

/*
 * For each of tables[] (as store_tables_activity() names them), its dead
 * tuples as pg_stat_user_tables counts them (a partitioned table's
 * partitions summed), -1 for a table that does not exist: one statement
 * on s's session, read by the ops thread for /metrics' per-source gauge.
 * STORE_REFUSED when the server counts nothing (track_counts off).
 */
int store_tables_dead_tuples(struct store *s, const char *const *tables,
			     size_t n, int64_t *dead, char *err, size_t errlen);

/* ---- schema ---- */

/*
 * `outbox-relay migrate`: on its own session (statement_timeout off, so
 * index builds take their time; opt's table check is skipped: the table
 * may not exist yet) applies every migration of sql/ not yet recorded,
 * printing one line per migration to out (may be NULL), then sets the
 * room a plain table keeps in its pages by opt's delete_sent
 * (migrate_room.c) and creates (notify_trigger) or drops the
 * statement-level NOTIFY trigger so the table matches OUTBOX_LISTEN.
 * Concurrent runs both succeed.
 */
int store_migrate(const struct store_options *opt, bool notify_trigger,
		  FILE *out, char *err, size_t errlen);

/* store_migrate() reporting index builds to progress (may be NULL). */
int store_migrate_watched(const struct store_options *opt, bool notify_trigger,
			  FILE *out, const struct store_progress *progress,
			  char *err, size_t errlen);

/* The newest schema version this relay knows. */
int store_schema_version(void);

/*
 * The protocol this relay speaks: what a contract step may rely on of
 * every relay left (docs/design.md §11, "Contract steps wait for the
 * relays' protocol"). A relay records it in the registry at each
 * heartbeat and refuses a table whose contract steps need a newer one.
 * 1: rows named by ctid and id; keyed rows leased by a key lock, never
 * classified by the head marker. Relays older than the registry's
 * protocol column record none.
 */
#define STORE_PROTOCOL 1

/*
 * `outbox-relay migrate --contract`: on its own session, runs each
 * contract step not yet recorded (dropping what only relays of an older
 * protocol need), one line per step to out (may be NULL). A step is
 * first recorded, and refused (the record taken back) while a replica
 * seen alive in the last STORE_ADMIN_DEAD_AFTER_S, before the record or
 * STORE_CONTRACT_SETTLE_MS after it, speaks an older protocol than the
 * step needs or records none; the error names such replicas. The expand
 * migrations must have run. Returns STORE_OK, or an error with err.
 */
int store_contract(const struct store_options *opt, FILE *out, char *err,
		   size_t errlen);

/*
 * `outbox-relay migrate --partition`: the contract step partition_by_id,
 * gated and recorded as store_contract()'s are (protocol 1). The table
 * becomes partitioned by range of id, the table itself its DEFAULT
 * partition, in one transaction that scans and builds nothing (its
 * indexes, identity, grants and NOTIFY trigger carried over); refused,
 * the table untouched, while a view, rule, foreign key, publication,
 * policy, trigger of the user's, inheritance, column privilege or unique
 * index other than the key names it. Done before: nothing to do.
 */
int store_partition(const struct store_options *opt, FILE *out, char *err,
		    size_t errlen);

/*
 * The records of store_contract()'s steps (contract) and of
 * store_partition()'s (partition) not yet recorded, each refused while a
 * replica of an older protocol is seen alive, without the wait or the
 * steps: `migrate` of many tables records every table's first, so that
 * the wait of the first table's steps is the wait of them all (a record
 * younger than STORE_CONTRACT_SETTLE_MS waits only the rest, and is
 * checked again before its step runs). One line per step recorded.
 */
int store_contract_record(const struct store_options *opt, bool contract,
			  bool partition, FILE *out, char *err, size_t errlen);

/* How long store_contract() waits after recording a step before it looks
 * at the registry again: two heartbeats of the relay's ops loop (every 3
 * s), so a relay that opened the table before the record shows itself. */
#define STORE_CONTRACT_SETTLE_MS 6500

/* ---- operator statements: registry, gauges, status, pauses ---- */

/*
 * Operator statements are few and varied: they run unprepared on the
 * store's session and keep no state of their own. Ages and "dead" are
 * computed with now() in the statements.
 */

/* A replica whose last heartbeat is older than this is shown dead. */
#define STORE_ADMIN_DEAD_AFTER_S 15
/* Registry rows silent for this long are deleted by any live replica. */
#define STORE_ADMIN_PRUNE_AFTER_S 86400

/* How long rows are kept: OUTBOX_RETENTION and OUTBOX_FAILED_RETENTION,
 * in milliseconds (0: no history; failed rows kept for good). */
struct store_kept {
	int64_t sent_ms;
	int64_t failed_ms;
};

/*
 * Upserts this replica's registry row: last_seen_at = now(), the version,
 * STORE_PROTOCOL, how long it keeps rows (kept), state 'draining' or
 * 'alive'. starting resets started_at (an id is host/pid, which a
 * restarted container may reuse). Also deletes rows silent for
 * STORE_ADMIN_PRUNE_AFTER_S, so the registry does not grow with every
 * deploy.
 */
int store_admin_heartbeat(struct store *s, const char *id, const char *version,
			  struct store_kept kept, bool draining, bool starting,
			  char *err, size_t errlen);

/*
 * The heartbeat of one relay in the registries of n tables at once
 * (stores, which share one session), as store_admin_heartbeat() but for
 * the prune and started_at's reset: one statement, so one plan and one
 * commit for all. 0, or a store_rc with err (none of them beaten).
 */
int store_admin_heartbeat_group(struct store *const *stores, size_t n,
				const char *id, const char *version,
				struct store_kept kept, bool draining,
				char *err, size_t errlen);

/* What an operator command asks of the relays' retentions. */
enum store_kept_for {
	/* Since when a row may have been deleted (a redrive's check):
	 * every relay in the registry, one crashed since counted by its
	 * retention grown by the time since its last heartbeat, and the
	 * command's own where shorter (a relay that stopped cleanly left
	 * the registry). */
	STORE_KEPT_SINCE,
	/* What the running relays keep, which a drop must not cut: the
	 * relays seen within STORE_ADMIN_DEAD_AFTER_S. */
	STORE_KEPT_LIVE,
};

/*
 * How long the table keeps rows, for an operator command whose own
 * settings are own (sent_ms < 0: none; failed_ms < 0: not asked, -1
 * returned): the shortest retentions the relays record in the registry
 * (a failed retention of 0, kept for good, the longest), as asked. own
 * counts where the registry cannot tell: alone where no relay recorded
 * one (said), the shorter of the two beside a relay of a version before
 * the record, and for STORE_KEPT_SINCE always where shorter. Said when
 * it is not own; own, said, when the registry cannot be read (none:
 * silently).
 */
struct store_kept store_admin_kept(struct store *s, struct store_kept own,
				   enum store_kept_for asked);

/* Deletes the registry row id (a replica that stopped cleanly). */
int store_admin_forget(struct store *s, const char *id, char *err,
		       size_t errlen);

/* Room for a server's start time as text (store_gauges.server). */
#define STORE_SERVER_MAX 48

/* The SQL-backed gauges, from two statements in one transaction. */
struct store_gauges {
	int64_t backlog;	   /* pending rows */
	int64_t oldest_pending_ms; /* now() - min(created_at) of pending; 0 */
	int64_t in_flight;
	int64_t failed;
	int64_t dead_tuples;	  /* pg_stat_user_tables.n_dead_tup */
	int64_t live_replicas;	  /* heartbeat within the dead threshold */
	int64_t blocked_keys;	  /* 0 without a blocked-keys table */
	int64_t notify_queue_ppm; /* pg_notification_queue_usage() * 1e6 */
	/* The xmin horizon: of everything that keeps vacuum from removing
	 * dead rows (other sessions' snapshots and transaction ids,
	 * replication slots' xmin, prepared transactions), the one with the
	 * oldest xmin. kind is "" when nothing but this session holds it. */
	struct store_horizon {
		char kind[24];	  /* session, replication_slot, ... */
		char name[72];	  /* application_name, slot name or gid */
		int64_t pid;	  /* 0 unless a session */
		int64_t xmin_age; /* age(xmin) in transactions */
		/* now() - xact_start of a session (NULL without
		 * pg_read_all_stats on another role's session), - prepared of
		 * a prepared transaction; 0 for a slot or when unknown. */
		int64_t age_ms;
	} horizon;
	/* The oldest of the database's own holders (its sessions, its
	 * prepared transactions, its logical slots), as horizon; kind ""
	 * when none. A writer of another database, a physical slot or a
	 * session of no database holds every database of its server alike,
	 * and is in horizon as seen from each. */
	struct store_horizon own_horizon;
	/* The server's start time (pg_postmaster_start_time()), which
	 * tells the reads of two servers apart. */
	char server[STORE_SERVER_MAX];
	/* age(xmin) of the oldest of each kind, 0 when none. */
	int64_t xmin_age_sessions, xmin_age_slots, xmin_age_prepared;
	/* The pending index's cumulative pg_stat_user_indexes counters:
	 * scans, entries returned, live rows fetched (docs/operations.md,
	 * outbox_lease_dead_index_entries_per_scan). */
	int64_t pending_idx_scans, pending_idx_read, pending_idx_fetched;
	/* The same counters for this call's own statements alone (the
	 * backlog count may read the pending index): the session reports
	 * them to the cumulative ones after it, so the caller subtracts them
	 * from the next interval. */
	int64_t own_idx_scans, own_idx_read, own_idx_fetched;
};

int store_admin_gauges(struct store *s, struct store_gauges *g, char *err,
		       size_t errlen);

/* The horizon's part of the gauges alone (horizon, own_horizon, server,
 * xmin_age_* and the pending index's counters; the rest 0), in one
 * statement: another database's, whose sessions the ops session's
 * statement cannot see holding a snapshot there (docs/design.md §13). */
int store_admin_horizon(struct store *s, struct store_gauges *g, char *err,
			size_t errlen);

/*
 * Everything `status` shows, read in one read-only repeatable-read
 * transaction so the sections agree with each other. Lists of rows are
 * cut to max_rows. On success *out is a new cJSON object the caller
 * deletes; its members are documented in docs/operations.md.
 */
int store_admin_status(struct store *s, int max_rows, cJSON **out, char *err,
		       size_t errlen);

/*
 * Inserts (or, when present, updates the reason and author of) the pause
 * of destination ("*" = all leasing). *was_paused says it existed.
 */
int store_admin_pause(struct store *s, const char *destination,
		      const char *reason, const char *paused_by,
		      bool *was_paused, char *err, size_t errlen);

/* Deletes the pause of destination; *was_paused says it existed. */
int store_admin_resume(struct store *s, const char *destination,
		       bool *was_paused, char *err, size_t errlen);

/*
 * The side tables `outbox-relay migrate` creates beside the outbox table
 * (docs/design.md §2). A table made by hand, say with CREATE TABLE x (LIKE
 * outbox_events INCLUDING ALL), may lack them: every session then works
 * without the features they carry (no operator pause can exist, no key can
 * be blocked) instead of failing each statement that names them, and the
 * daemon says once which features are off.
 */
enum store_side_table {
	STORE_SIDE_CONTROL = 1,	     /* operator pauses */
	STORE_SIDE_REPLICAS = 2,     /* the replica registry */
	STORE_SIDE_BLOCKED_KEYS = 4, /* ordered mode's blocked keys */
	STORE_SIDE_CLAIMS = 8,	     /* the lock leases' claims */
	/* Not a table: the outbox table's written_by column (migration
	 * 007), by which a lease finds rows committed late. */
	STORE_COLUMN_WRITTEN_BY = 16,
	/* Not a table: the relay_source column (migration 009), where the
	 * relay pins the source of a row whose producer left it NULL. */
	STORE_COLUMN_RELAY_SOURCE = 32,
};

/* Which side tables exist now: *present is a mask of the values above. */
int store_admin_side_tables(struct store *s, unsigned *present, char *err,
			    size_t errlen);

/*
 * The side tables missing from mask present, named for people ("x_control,
 * x_replicas"), and the features that are off without them ("operator
 * pauses, ..."); empty strings when none is missing.
 */
void store_side_tables_describe(const struct store *s, unsigned present,
				char *tables, size_t tables_len, char *features,
				size_t features_len);

/*
 * What `status --watch` redraws, from one statement whose counts each
 * read a partial index: pending rows (due now, retrying in backoff, crash
 * suspects, the oldest one's age), rows in flight by holder, and the rows
 * that finished within the last window_ms (sent; failed at once or with
 * their attempts spent), with the database clock's time ("at", seconds).
 * On success *out is a new cJSON object the caller deletes; its members
 * are listed in docs/operations.md.
 */
int store_admin_watch(struct store *s, int64_t window_ms, cJSON **out,
		      char *err, size_t errlen);

/*
 * Reads a time argument: a duration with a unit ("90s", "15m", "2h",
 * "3d") means that long before now(); anything else is read as a
 * timestamptz by Postgres. Writes the instant as ISO 8601 with offset
 * into out. STORE_INVALID when Postgres cannot read it.
 */
int store_admin_time(struct store *s, const char *text, char *out,
		     size_t outlen, char *err, size_t errlen);

/*
 * Startup check of a connection string (URI or key=value) by libpq's own
 * parser, without connecting. 0, or -1 with why saying what is wrong (never
 * quoting the string, which may hold a password). Any thread.
 */
int store_conninfo_check(const char *conninfo, char *why, size_t whylen);

/*
 * True when a session of conninfo (NULL: libpq's PG* variables) may run
 * in plaintext to a host that is not loopback: sslmode (or PGSSLMODE) is
 * not require, verify-ca or verify-full. hosts gets those hosts,
 * comma-separated (no user, database or password). Any thread.
 */
bool store_conninfo_plaintext(const char *conninfo, char *hosts, size_t len);

/* ---- the catalog: tables that match a pattern (docs/design.md §13) ---- */

/* A session that reads the catalog and nothing else; used by one thread. */
struct store_catalog;

/* Connects with opt's conninfo, application name and timeouts.
 * STORE_RECONNECT when Postgres cannot be reached. */
int store_catalog_open(struct store_catalog **out,
		       const struct store_options *opt, char *err,
		       size_t errlen);
/*
 * The tables matching pattern ("glob.name", table_pattern_parse()), each
 * "schema.name", sorted; *names is malloc'd (store_names_free()). With
 * oids not NULL, *oids gets each one's pg_class oid, malloc'd too: a table
 * dropped and made again between two looks (a tenant restored from a
 * dump) has the same name and another oid. Schemas whose names are not
 * plain identifiers are left out. STORE_RECONNECT when the session is
 * gone: close and open again.
 */
int store_catalog_tables(struct store_catalog *c, const char *pattern,
			 char ***names, uint32_t **oids, size_t *n, char *err,
			 size_t errlen);
/* The pg_class oid each of tables[] ("name" or "schema.name") names on
 * the catalog's session, by its search_path for an unqualified one; 0
 * for one that names no table. */
int store_catalog_oids(struct store_catalog *c, const char *const *tables,
		       size_t n, uint32_t *oids, char *err, size_t errlen);
void store_catalog_close(struct store_catalog *c);
void store_names_free(char **names, size_t n);
/* store_catalog_tables() of pattern on a catalog session of its own,
 * opened with opt and closed before it returns: for a command's one look. */
int store_catalog_match(const struct store_options *opt, const char *pattern,
			char ***names, size_t *n, char *err, size_t errlen);

/* ---- the NOTIFY listener (OUTBOX_LISTEN=on) ---- */

/*
 * A session that LISTENs on the table's wake-up channel (the trigger of
 * `outbox-relay migrate` notifies it once per inserting statement). It
 * never opens a transaction; it needs a direct connection (a pooler in
 * transaction mode drops LISTEN), so give it the listen URL as
 * opt->conninfo. Used by one thread.
 */
struct store_listener;

/* How long the listener's probe waits for its own notification. */
#define STORE_LISTEN_PROBE_MS 5000

/*
 * Connects with opt's conninfo, application name and statement timeout,
 * proves that notifications reach the session while it waits (a
 * notification to a channel of its own, sent from another session, must
 * come within STORE_LISTEN_PROBE_MS), and LISTENs on opt->table's channel
 * (none when it is NULL: add them). STORE_REFUSED when the probe did not
 * come back (a transaction-mode pooler drops notifications that arrive
 * between its statements); STORE_RECONNECT when Postgres cannot be
 * reached or refuses; STORE_ERROR for a bad table name.
 */
int store_listener_open(struct store_listener **out,
			const struct store_options *opt, char *err,
			size_t errlen);

/* LISTENs on table's channel too (the relay's other sources). Errors as
 * store_listener_open()'s. */
int store_listener_add(struct store_listener *l, const char *table, char *err,
		       size_t errlen);

/*
 * Waits up to timeout_ms for notifications and drains them all;
 * *notifications counts them (0 after a quiet timeout), and woken (when
 * not NULL; one flag per table, in the order open and add named them)
 * gets true for each table that had some. Notifications
 * already received (say, with the reply of store_listener_queue_usage())
 * are returned at once. STORE_RECONNECT when the connection is lost: close
 * the listener and open a new one.
 */
int store_listener_wait(struct store_listener *l, int64_t timeout_ms,
			size_t *notifications, bool *woken, char *err,
			size_t errlen);

/*
 * pg_notification_queue_usage() in millionths: a listener that falls
 * behind fills the queue, and then producers' commits fail.
 */
int store_listener_queue_usage(struct store_listener *l, int64_t *ppm,
			       char *err, size_t errlen);

/* Closes the session; l may be NULL. */
void store_listener_close(struct store_listener *l);

#endif
