/* SPDX-License-Identifier: MIT */
/*
 * Inside src/loops: struct relay and its threads, the thread entry points,
 * the primitives every loop thread uses (loop.c: health ticks, wake-ups,
 * sleeps, store sessions), what the lanes of one worker share (lanes.c),
 * and the two pieces of state the workers coordinate through (destination
 * pauses and the max-rate schedule, both under relay.lock). Private to
 * this folder (and its unit tests); loops/loops.h is the public surface.
 *
 * Files, from the bottom: loop.c (primitives), sources.c, lanes.c, pauses.c and
 * rate.c (use loop.c), worker.c, sweeper.c, cleaner.c, listener.c (the
 * loops), relay.c (lifecycle: creates the lanes and starts the loops).
 * Nothing calls upward.
 */
#ifndef OUTBOX_LOOPS_INT_H
#define OUTBOX_LOOPS_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "loops.h"
#include "base/base.h"
#include "config/config.h"
#include "store/store.h"

/* The lanes, a listener a database, and room for the sweeper, the cleaner
 * and discovery. */
#define RELAY_MAX_THREADS (72 + CONFIG_DATABASES_MAX)
#define RELAY_MAX_PAUSES STORE_MAX_PAUSES
/* The size of a destination pause key (see struct relay_pause): a key
 * cut short would match no row, so the lease would skip none. */
#define PAUSE_KEY_MAX STORE_PAUSE_KEY_MAX

/* What the lanes of one worker share (lanes.c). */
struct lanes;

/* The most sources a relay with patterns serves (docs/design.md §13). */
#define RELAY_MAX_SOURCES 10000
/* "database/schema.name": a database's name, a slash, two identifiers of
 * TABLE_NAME_MAX and a dot. */
#define SOURCE_NAME_MAX 130

/*
 * The relay's sources: OUTBOX_TABLE's tables, then those its patterns
 * find (discover.c). Append-only: a source keeps its index for the
 * relay's life, so every per-source array of the threads is indexed the
 * same; one whose table is gone is marked so, and unmarked if it comes
 * back. An entry below n never changes but for gone, epoch and oid (the
 * writers' alone), and n grows with a release store after the entry is
 * written, so readers take no lock; writers (the discovery thread,
 * relay_create) hold lock.
 */
struct source_list {
	pthread_mutex_t lock;
	size_t cap;
	bool several_databases; /* names then say "database/table" */
	/* Per source: its name, where its table starts in it, and the
	 * index of its database (config_database_url()). */
	char (*names)[SOURCE_NAME_MAX];
	unsigned char *table_at;
	unsigned char *db;
	const struct config *cfg; /* the databases' names */
	atomic_bool *gone;
	/* Per source: the catalog's oid of its table when a pattern found
	 * it (0: listed, not known), the writers' alone; and how many times
	 * its table came back or was found made anew (another oid under
	 * the name: dropped and made again between two discovery passes),
	 * after which each thread opens its store of it afresh. */
	uint32_t *oid;
	atomic_uint *epoch;
	atomic_size_t n;
};

/*
 * One loop thread, as /healthz sees it. Every field but last_tick_ms is
 * set by relay_start() before the thread runs; tid and started are then
 * used only by the thread that called relay_start() (relay_finished,
 * relay_join).
 */
struct relay_thread {
	char name[32];
	pthread_t tid;
	bool started;
	atomic_llong last_tick_ms; /* clock_ms() of its last loop pass: written
				      by the thread, read by relay_healthy */
	int64_t max_interval_ms;   /* healthy while ticks are this close */
	struct relay *relay;
	int index;	     /* worker number */
	struct lanes *lanes; /* a worker lane's: its worker's lanes */
};

/* A destination (or destination + chr(31) + routing key) refusing events.
 * Lives in relay.pauses: only touched with relay.lock held. */
struct relay_pause {
	char key[PAUSE_KEY_MAX];
	int64_t until_ms;   /* clock_ms() */
	int64_t backoff_ms; /* doubles each time it refuses again */
};

/*
 * Sharing: struct relay is created by main and outlives every thread. Each
 * field below says how it is shared: read-only after relay_create() or
 * relay_start(), a C11 atomic read and written without locks, or under
 * `lock`. A worker's publisher is shared by its lanes under the lanes'
 * publisher lock (lanes.c); whatever else a thread keeps (its store
 * session, its batch) is its own and never shared.
 */
struct relay {
	/* Read-only after relay_create(). */
	const struct config *cfg;
	const struct publisher_ops *pub_ops; /* each worker opens one */
	char host[64];
	int pid;

	/* Atomics, read and written without locks. */
	atomic_int stopping;	  /* 1 once shutdown began */
	atomic_int marks_failed;  /* 1 if a mark could not be written */
	atomic_int workers_ready; /* workers with a healthy publisher */
	/* Set by a thread whose session was connected anew
	 * (sources_reconnect()), taken by the sweeper: what ended the
	 * session (a restart, a failover) may have ended leases with it,
	 * whose rows wait for a sweep, and the sweeper's interval would
	 * keep them waiting for its whole length. */
	atomic_bool sweep_asked;
	/* The sources; see struct source_list for how it is shared. */
	struct source_list sources;
	/* The workers' stores of each source rescan in turn (store.h);
	 * one per source, moved by them. */
	struct store_rescan_pace *rescan_pace;
	/* And in ordered mode take their turns among its keys (store.h);
	 * one per source, each under its own lock. */
	struct store_key_turn *key_turn;
	/* And unordered, among its due rows (store.h); the same. */
	struct store_due_turn *due_turn;
	/* Per source: bumped by relay_wake_source() when rows may have come
	 * (a notification, a sweep); the workers compare it with what they
	 * saw last. */
	atomic_ullong *source_wake;
	/* Per source: when it is to be leased again (clock_ms; 0: not
	 * asked), set by relay_wake_source_at(): the end of the pause of a
	 * destination that refused its rows, which nothing else would
	 * announce. */
	atomic_llong *source_wake_at;
	/* Per source: what /metrics shows of it (relay_source_stats()),
	 * counted by the loop threads with atomics. */
	struct source_stats {
		atomic_ullong sent, retried, failed;
		atomic_int failing; /* threads that have it set aside */
		/* Age of the oldest event of its last leased batch when it
		 * was leased, ms; 0 after a lease that found nothing. */
		atomic_llong lag_ms;
		/* Its table's dead tuples as the ops thread last read them
		 * (relay_note_dead_tuples); -1: not read. */
		atomic_llong dead_tuples;
	} * source_stats;

	/* lock guards every field from wake_gen to notify_ppm; wake is
	 * signalled under it by relay_wake(). */
	pthread_mutex_t lock;
	pthread_cond_t wake; /* on CLOCK_MONOTONIC */
	uint64_t wake_gen;   /* bumped by relay_wake() */
	struct relay_pause pauses[RELAY_MAX_PAUSES];
	size_t n_pauses;
	double rate_next_ms; /* max-rate schedule (clock_ms units) */
	/* Per database: its notification queue's usage as last read
	 * (relay_note_notify_usage()), under lock so that the highest is
	 * published from one consistent set. */
	int64_t notify_ppm[CONFIG_DATABASES_MAX];

	/* Filled by relay_start() before each thread starts; see struct
	 * relay_thread for what is shared after that. */
	struct relay_thread threads[RELAY_MAX_THREADS];
	int n_threads;
	/* One per worker; created by relay_start(), freed by relay_join()
	 * after the threads. */
	struct lanes *lanes;
	/* Written by relay_stop(), on the thread that runs the relay. */
	int64_t shutdown_started_ms;
};

#define RECONNECT_MIN_MS 100
#define RECONNECT_MAX_MS 5000

/* Thread entry points; arg is the thread's struct relay_thread. */
void *worker_main(void *arg);
void *sweeper_main(void *arg);
void *cleaner_main(void *arg);
void *listener_main(void *arg);
void *discovery_main(void *arg);

/* ---- loop.c: what every loop thread uses ---- */

/* Records a loop pass for relay_healthy(). */
void loop_tick(struct relay_thread *th);

/* Source i may have rows (a notification, a sweep): wakes the workers and
 * makes source i due if it was idle. */
void relay_wake_source(struct relay *r, size_t i);
/* Makes source i due at at_ms (clock_ms), if it is idle then; the
 * earliest of several asks holds. */
void relay_wake_source_at(struct relay *r, size_t i, int64_t at_ms);

/* The current wake-up generation, for relay_idle_since(). */
uint64_t relay_wake_generation(struct relay *r);

/* A retry delay doubled, at most max: the backoff of every loop's
 * reconnects and of a source set aside. */
int64_t loop_backoff_grow(int64_t backoff, int64_t max);

/* Sleeps up to ms, returning early on shutdown or when a wake-up
 * (relay_wake()) came after generation *gen was read (gen NULL: only
 * shutdown ends it early); keeps the thread's health tick fresh and calls
 * service (if not NULL) every second so broker connections keep their
 * heartbeats. */
void relay_idle_since(struct relay_thread *th, const uint64_t *gen, int64_t ms,
		      void (*service)(void *), void *state);

/* A reconnect's or a retry's wait: only shutdown ends it early, not the
 * wake-ups of other threads (with LISTEN on, one a notification), which
 * would turn the backoff into a try each. */
void relay_backoff(struct relay_thread *th, int64_t ms);

/* Writes the application_name of thread `who` into out. */
void relay_app_name(const struct relay *r, const char *who, char *out,
		    size_t outlen);

/* ---- sources.c: the outbox tables a thread serves (§13) ---- */

/* Fills l with cfg's tables (patterns are discovery's); -1 when out of
 * memory. */
int source_list_init(struct source_list *l, const struct config *cfg);
void source_list_free(struct source_list *l);
/* What source_list_add() found. */
enum source_found {
	SOURCE_KNOWN,  /* listed already, as it was */
	SOURCE_ADDED,  /* new to the list */
	SOURCE_BACK,   /* listed already, and gone until now */
	SOURCE_REMADE, /* listed already, its table made anew (another oid) */
};
/* Adds table, whose catalog oid is oid (0: not known), or finds it listed
 * already; false when the list is full. Writers only. *index gets its
 * index. A table back or made anew moves its epoch on. */
bool source_list_add(struct source_list *l, size_t db, const char *table,
		     uint32_t oid, size_t *index, enum source_found *found);
void relay_source_set_gone(struct relay *r, size_t i, bool gone);
/* How far behind source i is, as the lease b from it just saw it
 * (/metrics): the age of b's oldest event, 0 when b is empty. */
void source_note_lag(struct relay *r, size_t i, const struct lease_batch *b);
/* One log line about source i with two counts (k1 v1, k2 v2). */
void source_log_counts(enum log_level level, const char *msg, struct relay *r,
		       size_t i, const char *k1, size_t v1, const char *k2,
		       size_t v2);

/* Up to this many sources, each idle one is leased every poll interval
 * and each is swept every sweep interval, as one is (a few statements a
 * second at most); beyond, an idle source is leased when the statistics
 * show a write to it, a notification or a sweep wakes it, its next retry
 * is due, or a backstop passes, and swept when written to or left with
 * claims open (docs/design.md §13). */
#define SOURCES_POLLED_MAX 8

/* Whether the relay serves sources beyond SOURCES_POLLED_MAX, or may
 * (patterns): idle ones are then leased and swept only when needed. */
bool sources_gated(struct relay *r);

/*
 * A loop thread's stores of the relay's sources (struct source_list), all
 * on one
 * session (store_open_sharing). A source whose statement fails is set
 * aside and tried again with backoff while the others go on. Only its
 * thread touches it.
 */
struct source_stores {
	size_t n;
	struct source_store {
		struct store *store; /* NULL: not open (yet, or failing) */
		bool failing;	     /* set aside; its failure was logged */
		int64_t retry_ms;    /* set aside until (clock_ms) */
		int64_t backoff_ms;
		/* The cleaner's: when it last tended the source's
		 * partitions with this store (0: not yet). */
		int64_t tended_ms;
		/* The source's epoch when the store was opened: another
		 * now lets it go, to be opened afresh. */
		unsigned epoch;
	} * at;
	char who[32]; /* the thread's name, for application_name */
};

/* Opens a store for each source, retrying until at least one is open (the
 * others are tried again as they are used). False when shutdown began
 * first or memory ran out. */
bool sources_open(struct relay_thread *th, const char *who,
		  struct source_stores *ss);
void sources_close(struct relay *r, struct source_stores *ss);
/* Source i's store, opened again if it was not; NULL while it is set
 * aside. */
struct store *sources_store(struct relay_thread *th, struct source_stores *ss,
			    size_t i);
/* Lets go of every gone or remade source's store and failing mark in ss,
 * as sources_store() does for the source it is asked for: a worker asks
 * only for sources its round-robin picks, which never picks a gone one,
 * and the sweeper and cleaner may not ask for a while. */
void sources_let_go_gone(struct relay *r, struct source_stores *ss);
/* Until when source i is set aside, 0 when it is not. */
int64_t sources_retry_ms(const struct source_stores *ss, size_t i);
/* Source i's statement worked: a failure it had is logged as over. */
void sources_ok(struct relay *r, struct source_stores *ss, size_t i);
/*
 * What failed (what: "lease", "sweep"...) of source i, with the store's
 * rc and err: STORE_RECONNECT reconnects the session for every source
 * (backing off while Postgres is away; a table that fails its check then
 * sets that source aside alone); anything else sets source i aside. Logs
 * the first failure of a streak. -1 when shutdown began first.
 */
int sources_failed(struct relay_thread *th, struct source_stores *ss, size_t i,
		   int rc, const char *what, const char *err);
/* Reconnects the session of source i's store as sources_failed() does for
 * STORE_RECONNECT, without logging what failed. */
int sources_reconnect(struct relay_thread *th, struct source_stores *ss,
		      size_t i);

/*
 * When each source of a worker is due to lease next, and its operator
 * pauses as last read: shared by the worker's lanes and touched only by
 * the lane that holds the lease turn (lanes_take_turn), whose store the
 * pauses were read with.
 */
struct source_turns {
	size_t n;
	size_t next; /* where the round-robin goes on */
	struct source_turn {
		int64_t due_ms;	    /* no lease of it before (clock_ms) */
		bool idle;	    /* its last lease found nothing: a wake-up
				       makes it due */
		uint64_t seen_wake; /* relay.source_wake[i] as last seen */
		/* store_tables_activity()'s count as last read */
		int64_t activity;
		bool activity_known;
		int64_t control_read_ms;
		bool control_global;		/* an operator paused it all */
		char (*control)[PAUSE_KEY_MAX]; /* its paused destinations */
		size_t n_control;
	} * at;
	size_t n_paused; /* sources with control_global set */
	/* Several sources: when their activity is read next (clock_ms),
	 * and room for the counts. */
	int64_t next_activity_ms;
	int64_t *counts;
	size_t read_n; /* sources the last read covered */
};

struct source_turns *source_turns_create(size_t n);
void source_turns_destroy(struct source_turns *t);
/*
 * The next source whose lease is due at now and which ss has not set
 * aside, in round-robin order from the last one picked; SIZE_MAX when
 * none is (source_turns_earliest() says until when). An idle source woken
 * since the last pick (relay_wake_source) is due.
 */
size_t source_turns_pick(struct source_turns *t, struct relay *r,
			 const struct source_stores *ss, int64_t now);
/* A count of sources_read_activity() for a source it could not read. */
#define SOURCE_ACTIVITY_UNREAD INT64_MIN
/* One for a source of a database ss holds no session of and could open
 * none: nothing was tried, so nothing is known to have moved. */
#define SOURCE_ACTIVITY_NO_SESSION (INT64_MIN + 1)
/* Whether a count of sources_read_activity() is one. */
static inline bool source_activity_counted(int64_t count)
{
	return count != SOURCE_ACTIVITY_UNREAD &&
	       count != SOURCE_ACTIVITY_NO_SESSION;
}
/* Fills counts[0..n) with each source's writes as Postgres' statistics
 * count them (store_tables_activity), one statement a database, on the
 * sessions of ss (a store of a database it has none of is opened);
 * SOURCE_ACTIVITY_UNREAD where its database could not be read,
 * SOURCE_ACTIVITY_NO_SESSION where no store of it would open. False when
 * none was read. Ticks th before each database's read. */
bool sources_read_activity(struct relay_thread *th, struct source_stores *ss,
			   size_t n, int64_t *counts);
/* Of several sources: takes sources_read_activity()'s counts (NULL: none
 * read), making due each idle source whose count moved or could not be
 * read; one of a database without a session is left as it was. */
void source_turns_note_activity(struct source_turns *t, size_t n,
				const int64_t *counts);
/*
 * Of many sources (sources_gated), once per every_ms: which idle ones
 * were written since the last look, one statement on any store of ss for
 * them all (store_tables_activity), instead of a lease of each
 * (docs/design.md §13). Counts that cannot be read make every idle source
 * due, as polling would.
 */
void source_turns_read_activity(struct source_turns *t, struct relay_thread *th,
				struct source_stores *ss, int64_t every_ms);
/* Keeps a source's operator pauses, keys[0..n), for the reads between
 * refreshes; false when out of memory (the pauses kept before stay). */
bool source_turn_keep_control(struct source_turn *t,
			      char (*keys)[PAUSE_KEY_MAX], size_t n);
/* Any store ss has open in database db, one not set aside if there is;
 * NULL when none is open. */
struct store *sources_any(struct relay *r, const struct source_stores *ss,
			  size_t db);
/* The earliest time any source is due (or leaves its set-aside), or,
 * of several, their activity is to be read. */
int64_t source_turns_earliest(const struct source_turns *t, struct relay *r,
			      const struct source_stores *ss);

/* ---- lanes.c: what the lanes of one worker share ---- */

/*
 * The lanes of n workers, `per_worker` lane threads each; NULL with err.
 * Each worker's lanes share one publisher of r's backend (opened on first
 * use), used by one lane at a time under the lanes' publisher lock, and
 * one lease cadence (docs/design.md §7).
 */
struct lanes *lanes_create(struct relay *r, int n, int per_worker, char *err,
			   size_t errlen);
/* Worker i's lanes. */
struct lanes *lanes_of_worker(struct lanes *all, int i);
/* The worker's turns across its sources (see struct source_turns). */
struct source_turns *lanes_source_turns(struct lanes *l);
/* After every lane thread returned. */
void lanes_destroy(struct lanes *all, int n);

/* Opens or probes the worker's publisher when due and services it; true
 * when healthy, else *next_probe_ms says when to ask again. */
bool lanes_publisher_ready(struct lanes *l, const struct config *cfg,
			   int64_t *next_probe_ms);
/* Keeps an idle publisher's connection serviced (heartbeats); a
 * relay_idle_since() service callback taking the lanes. */
void lanes_publisher_service(void *lanes);
/* Publishes on the worker's publisher when ticket's turn comes (batches go
 * out in lease order); ctx->tick runs on this thread while it waits, and
 * ctx's callbacks run on it during the publish, whose deadline is then
 * timeout_ms from the turn or ctx->deadline_ms (the lease's), whichever
 * comes first. An unhealthy publisher
 * hands nothing over (PUB_NOT_WRITTEN). Returns what publisher_publish()
 * did, -1 when it was not called. */
int lanes_publish(struct lanes *l, uint64_t ticket,
		  const struct outbox_event *events, size_t n,
		  int64_t timeout_ms, struct publish_ctx *ctx,
		  struct pub_result *results);
/* Gives up ticket's turn, in its order, for a batch with nothing to
 * publish, calling ctx->tick (unless ctx is NULL) while it waits, as
 * lanes_publish() does. Every ticket goes through lanes_publish() or this,
 * once. */
void lanes_pass(struct lanes *l, uint64_t ticket, struct publish_ctx *ctx);
/* docs/design.md §7: closes the publisher before a lane releases never-sent
 * rows at shutdown. */
void lanes_close_before_release(struct lanes *l);
/* A lane thread ends; the last one closes the publisher. */
void lanes_leave(struct lanes *l);

/* Waits for this lane's turn to lease (one lane leases at a time, and not
 * before the cadence set by the last lease). False when shutdown began. */
bool lanes_take_turn(struct lanes *l, struct relay_thread *th);

/* How a lease turn ended. */
enum turn_end {
	TURN_SKIPPED, /* no lease ran (paused, failed): the next lane may
			 lease at next_lease_ms */
	TURN_EMPTY,   /* the lease found nothing: idle until next_lease_ms
			 or a wake-up after generation wake_gen */
	TURN_LEASED,  /* rows were leased: they get a publish ticket */
};

/* Ends the turn: the next lease not before next_lease_ms (and, for
 * TURN_EMPTY, not before a wake-up after wake_gen either). For
 * TURN_LEASED returns the batch's publish ticket, else 0. */
uint64_t lanes_end_turn(struct lanes *l, enum turn_end how,
			int64_t next_lease_ms, uint64_t wake_gen);

/* True when a lease that began at or after ms (clock_ms) is under way or
 * found nothing and left the lanes idle. */
bool lanes_leased_since(struct lanes *l, int64_t ms);

/* ---- pauses.c: destinations that refused events (under r->lock) ---- */

/* Pauses destination key (doubling its pause if it is refused again after
 * the last one ended); reason goes to the log. Returns when its pause
 * ends (clock_ms). */
int64_t pause_destination(struct relay *r, const char *key, const char *reason);

/* Copies up to max active pause keys into keys[] and returns how many;
 * forgets pauses long expired. */
size_t active_pauses(struct relay *r, char (*keys)[PAUSE_KEY_MAX], size_t max);

/* ---- rate.c: the per-replica max rate (under r->lock) ---- */

/* Reserves n events of the rate; returns the ms to wait before using
 * them (0 without a max rate). */
int64_t rate_reserve(struct relay *r, double n);

/* Reserves n events and sleeps until they may be used: only shutdown ends
 * the sleep early (service as for relay_idle_since()). */
void rate_wait(struct relay_thread *th, double n, void (*service)(void *),
	       void *state);

/* Gives back n reserved events that were not used. */
void rate_refund(struct relay *r, double n);

#endif
