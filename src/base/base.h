/* SPDX-License-Identifier: MIT */
/*
 * The base every part of the relay stands on: UTF-8, logging, the clocks,
 * the process-wide counters, the outbox table's name and the leased row
 * type.
 * Nothing here knows about Postgres, brokers or threads other than its own.
 */
#ifndef OUTBOX_BASE_H
#define OUTBOX_BASE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/*
 * UTF-8 (utf8.c). utf8_decode: the sequence at s (len > 0 bytes) into *cp,
 * returning its length, or 0 when the bytes are not valid UTF-8 (a bad
 * lead or continuation byte, truncated, overlong, a surrogate, above
 * U+10FFFF). utf8_copy_valid: src into dst (size > 0) as valid UTF-8,
 * each byte of an invalid sequence as '?', cut on a character's boundary
 * to fit: text from elsewhere (a Postgres name in a database of another
 * encoding) bound for a Prometheus label, which must be valid UTF-8.
 */
size_t utf8_decode(const unsigned char *s, size_t len, uint32_t *cp);
void utf8_copy_valid(char *dst, size_t size, const char *src);

/*
 * Logging: one line per message to stderr, JSON objects ({"ts","level",
 * "msg", fields...}) or plain text. Each thread may name itself once
 * (log_set_thread) and every line it writes carries that name, so a
 * worker's lines say which worker wrote them.
 *
 * Thread safety: lines are written with one fputs under the stdio lock,
 * so lines from different threads never interleave. The level and format
 * are set once at startup, before threads start.
 */

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

void log_setup(enum log_level level, bool json);
/* Parses "debug", "info", "warn", "error"; returns -1 when unknown. */
int log_level_parse(const char *s);
/* Names the calling thread in its log lines; name is copied. */
void log_set_thread(const char *name);
bool log_enabled(enum log_level level);

/*
 * Writes msg at level with extra string fields given as key, value pairs
 * ending with NULL: log_fields(LOG_WARN, "lost lease", "id", id, NULL).
 */
void log_fields(enum log_level level, const char *msg, ...)
    __attribute__((sentinel));

/* printf-style message without fields. */
void log_msg(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define log_debug(...)                                                         \
	do {                                                                   \
		if (log_enabled(LOG_DEBUG))                                    \
			log_msg(LOG_DEBUG, __VA_ARGS__);                       \
	} while (0)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

/*
 * Monotonic time for local deadlines and sleeps. Leases, backoff and
 * retention never use it: the database clock is the only clock for those.
 */

/* Milliseconds on CLOCK_MONOTONIC. */
int64_t clock_ms(void);
/* Microseconds since the epoch on CLOCK_REALTIME (latency metrics only). */
int64_t clock_wall_us(void);
/* The CLOCK_MONOTONIC time ms milliseconds from now, as the absolute
 * deadline of pthread_cond_timedwait() on a condition variable created
 * with pthread_condattr_setclock(CLOCK_MONOTONIC). */
struct timespec clock_monotonic_after(int64_t ms);
/* Sleeps ms milliseconds (restarting after signals). */
void clock_sleep_ms(int64_t ms);

/*
 * Process-wide metrics. Base keeps the values; ops names them and renders
 * them in the Prometheus text format.
 *
 * Sharing: every field is a C11 atomic updated with relaxed ordering by
 * whichever thread observes the event; nothing else about them is shared.
 * A scrape may see counters mid-batch, which Prometheus tolerates. The one
 * exception is the text of info metrics (below), copied under a lock.
 */

enum metric_counter {
	MC_SENT,	/* broker acknowledged, marked sent */
	MC_RELEASED,	/* never written: released */
	MC_DESTINATION, /* destination refused: released, paused */
	MC_TRANSPORT,	/* outcome unknown: retried, charged */
	MC_EVENT,	/* nacked: retried or failed when spent */
	MC_PERMANENT,	/* failed at once */
	MC_LOST_LEASES, /* rows of leases that did not commit */
	MC_LEASES,	/* lease statements run */
	MC_GIVEN_UP,	/* leases given up: their claims were late */
	MC_SWEEPS,	/* sweep ticks that held the lock */
	MC_SWEPT_PENDING,
	MC_SWEPT_FAILED,
	MC_CLEANS,
	MC_CLEANED_SENT,
	MC_CLEANED_FAILED,
	MC_PARTITIONS_MADE,    /* daily partitions made ahead */
	MC_PARTITIONS_DROPPED, /* daily partitions dropped by retention */
	MC_DB_RECONNECTS,
	MC_LISTEN_PROBES_LOST, /* LISTEN sessions whose probe did not come */
	MC_PUBLISHER_FAILURES, /* probes or opens that failed */
	MC_RENEWALS,
	MC_IN_DOUBT, /* handed to the broker, outcome unknown */
	MC_PREPARED, /* statements prepared on a server session */
	MC_COUNT
};

enum metric_gauge {
	MG_PUBLISHERS_UNHEALTHY, /* workers whose publisher is down */
	MG_DESTINATIONS_PAUSED,
	MG_PAUSED_GLOBALLY, /* 1 while an operator pause is in force; of
			       several tables, how many are paused */
	MG_LAST_SWEEP_MS,   /* wall clock ms of the last sweep */
	MG_LAST_CLEAN_MS,
	MG_BACKLOG,	      /* pending rows (http thread) */
	MG_OLDEST_PENDING_MS, /* age of the oldest pending row */
	MG_IN_FLIGHT,
	MG_FAILED_ROWS,
	MG_DEAD_TUPLES,
	MG_LIVE_REPLICAS,
	MG_BLOCKED_KEYS,
	MG_NOTIFY_QUEUE_PPM, /* pg_notification_queue_usage() * 1e6 */
	MG_KAFKA_QUEUE_DEPTH,
	/* Age of the oldest lease transaction open on this relay now, read
	 * at the scrape from the lanes' slots below. */
	MG_OLDEST_LEASE_MS,
	MG_XMIN_HORIZON_AGE_MS,	  /* seconds-age of the horizon's holder */
	MG_XMIN_HORIZON_XMIN_AGE, /* its age(xmin), in transactions */
	MG_XMIN_AGE_SESSIONS,	  /* oldest age(xmin) of each kind */
	MG_XMIN_AGE_SLOTS,
	MG_XMIN_AGE_PREPARED,
	MG_LEASE_DEAD_ENTRIES_MILLI, /* pending-index entries passed per scan,
					x 1000 */
	MG_COUNT
};

/*
 * Series whose labels are text (an info metric, value 1): its label values
 * are set as a whole under a lock, since text does not fit an atomic.
 * Values longer than METRICS_INFO_VALUE_MAX - 1 bytes are cut.
 */
enum metric_info {
	MI_XMIN_HORIZON_HOLDER, /* kind, name, pid, database */
	MI_COUNT
};
#define METRICS_INFO_LABELS 4
#define METRICS_INFO_VALUE_MAX 72

enum metric_histogram {
	MH_BATCH_SIZE,
	MH_LEASE_SECONDS,
	MH_MARK_SECONDS,
	MH_SWEEP_SECONDS,
	MH_PUBLISH_SECONDS,
	MH_END_TO_END_SECONDS,
	MH_COUNT
};

void metrics_add(enum metric_counter c, uint64_t n);
uint64_t metrics_get(enum metric_counter c);
void metrics_set(enum metric_gauge g, int64_t v);
void metrics_gauge_add(enum metric_gauge g, int64_t delta);
int64_t metrics_gauge(enum metric_gauge g);
/*
 * The lease transactions open on this relay (MG_OLDEST_LEASE_MS): each
 * lane takes a slot once and stores in it when its open lease began (a
 * relaxed atomic store per batch, no SQL). metrics_lease_slot() returns
 * -1 when every slot is taken; the other two ignore slot -1.
 */
int metrics_lease_slot(void);
void metrics_lease_open(int slot, int64_t since_ms);
void metrics_lease_closed(int slot);
void metrics_set_info(enum metric_info i,
		      const char *const values[METRICS_INFO_LABELS]);
void metrics_info(enum metric_info i,
		  char values[METRICS_INFO_LABELS][METRICS_INFO_VALUE_MAX]);
/* Seconds-valued histograms take microseconds; MH_BATCH_SIZE a count. */
void metrics_observe(enum metric_histogram h, uint64_t value);

/* A histogram as metrics_observe() filled it, read for rendering. */
#define METRICS_MAX_BUCKETS 16
struct metrics_histogram {
	const double *bounds; /* upper bounds, ascending */
	int n_bounds;
	bool seconds; /* observed in microseconds, shown in seconds */
	uint64_t buckets[METRICS_MAX_BUCKETS]; /* observations <= bounds[i] */
	uint64_t sum;
	uint64_t count;
};

void metrics_histogram_read(enum metric_histogram h,
			    struct metrics_histogram *out);

/*
 * The outbox table's name, validated once and rendered every way the SQL
 * needs it. Derived names (indexes, functions, side tables, the NOTIFY
 * channel) append at most TABLE_SUFFIX_MAX bytes to the bare name, so the
 * name is limited to keep them within Postgres' 63-byte identifiers.
 */

#define TABLE_SUFFIX_MAX 20
#define TABLE_NAME_MAX (63 - TABLE_SUFFIX_MAX)

struct outbox_table {
	char schema[64];   /* "" when unqualified */
	char name[64];	   /* bare, validated */
	char quoted[140];  /* "schema"."name" or "name" */
	char prefix[70];   /* "schema". or "" */
	char literal[140]; /* 'schema.name' or 'name' */
};

/*
 * Parses "name" or "schema.name": each part starts with a letter or
 * underscore, continues with letters, digits or underscores, and is at
 * most TABLE_NAME_MAX bytes. Returns 0, or -1 with err saying why.
 */
int table_parse(const char *text, struct outbox_table *t, char *err,
		size_t errlen);
/* Whether text is a table without a schema, as table_parse() takes it:
 * the one the session's search_path finds. */
bool table_is_bare(const char *text);

/*
 * A table pattern, "glob.name": the schema a glob of letters, digits,
 * underscores and at least one *, the table a name as table_parse()
 * takes it (docs/design.md §13). table_is_pattern() says whether text
 * has a *; table_pattern_parse() writes the schema glob as a LIKE pattern
 * (`_` escaped, `*` as `%`) and the table's name. Returns 0, or -1 with
 * err saying why. table_pattern_match() says whether "schema.name"
 * matches one.
 */
bool table_is_pattern(const char *text);
int table_pattern_parse(const char *text, char *like, size_t likelen,
			char *name, size_t namelen, char *err, size_t errlen);
bool table_pattern_match(const char *pattern, const char *table);

/* Writes the quoted name of a side object: "schema"."<name><suffix>". */
void table_derived(const struct outbox_table *t, const char *suffix, char *out,
		   size_t outlen);

/*
 * One leased outbox row as the publishers see it.
 *
 * Ownership: every pointer points into the lease batch that produced the
 * event (store.h, struct lease_batch) and lives exactly as long as it.
 * Publishers must copy what they keep past publish().
 */

struct outbox_event {
	const char *id;		   /* uuid text; CloudEvents id */
	int64_t seq;		   /* insertion order */
	const char *type;	   /* CloudEvents type (may be "" on tables
				      without the CHECKs: must fail encode) */
	const char *source;	   /* pinned at lease, never NULL */
	const char *subject;	   /* NULL when absent */
	const char *content_type;  /* datacontenttype */
	const char *exchange;	   /* NULL: the backend's default destination */
	const char *routing_key;   /* never NULL, may be "" */
	const char *partition_key; /* NULL when absent */
	const unsigned char *payload;
	size_t payload_len;
	const char *headers_json; /* the headers column as JSON text */
	const char *time;	  /* created_at, RFC 3339 UTC */
	int64_t created_at_us;	  /* created_at, microseconds since epoch */
	int attempts;		  /* including this lease's charge */
	int max_attempts;
};

#endif
