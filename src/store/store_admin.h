/* SPDX-License-Identifier: MIT */
/*
 * Shared by the store's operator queries (store_admin.c, store_status.c):
 * the side objects' names, running a query for a report, and the SQL
 * fragments that render times for people. Private to src/store/.
 */
#ifndef OUTBOX_STORE_ADMIN_H
#define OUTBOX_STORE_ADMIN_H

#include <libpq-fe.h>
#include <stddef.h>

#include "base/base.h"

/* Timestamps as people and jq read them: UTC, ISO 8601, whole seconds. */
#define ISO(c)                                                                 \
	"to_char((" c ") AT TIME ZONE 'UTC', "                                 \
	"'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
/* Seconds between two instants, one decimal, as a JSON number. */
#define SECS(a, b)                                                             \
	"round(extract(epoch FROM (" a ") - (" b "))::numeric, 1)::float8"

/* Postgres type oids the JSON conversion distinguishes (pg_type.h). */
#define OID_BOOL 16
#define OID_INT8 20
#define OID_INT2 21
#define OID_INT4 23
#define OID_JSON 114
#define OID_FLOAT4 700
#define OID_FLOAT8 701
#define OID_NUMERIC 1700
#define OID_JSONB 3802

/* The quoted names of the table's side objects. */
struct names {
	char registry[160];
	char control[160];
	char blocked[160];
	char claims[160];
};

void admin_names_of(const struct outbox_table *t, struct names *n);

/* The holder of a lease: leased_by up to its second '/' (host/pid, the
 * replica registry's id), or all of it when it has no such part. */
#define ADMIN_HOLDER                                                           \
	"CASE WHEN leased_by LIKE '%/%' THEN "                                 \
	"split_part(leased_by, '/', 1) || '/' || "                             \
	"split_part(leased_by, '/', 2) ELSE leased_by END"

/*
 * Which sessions of pg_stat_activity a hold back this database's xmin
 * horizon, and by how many transactions. Vacuum here ignores the
 * snapshots of other databases' sessions (a pg_dump of another database
 * holds nothing back here), but not their transaction ids: every snapshot
 * taken here counts those as running, so a writer anywhere holds back
 * through them. A walsender (no database) fed a standby's xmin holds back
 * every database. This session is left out, and so are those Postgres
 * leaves out of the horizon itself though they show an xmin: a lazy
 * VACUUM (one an hour long, anti-wraparound say, was named the holder,
 * and the alert fired while vacuum was held back by nothing), and a
 * walsender decoding logically (START_REPLICATION of a slot), whose
 * slot's catalog_xmin counts instead; not one copying a table's first
 * rows for a subscription under a snapshot, which holds the horizon
 * (another role's backend_type and query read NULL without
 * pg_read_all_stats: counted). A VACUUM still waiting for its table's
 * lock is not yet in pg_stat_progress_vacuum: it is counted until it
 * starts.
 */
#define ADMIN_SESSION_LOCAL                                                    \
	"(a.datname = current_database() OR a.datid IS NULL)"
#define ADMIN_SESSION_HOLDS                                                    \
	"a.pid <> pg_backend_pid() AND (a.backend_xid IS NOT NULL OR "         \
	"(a.backend_xmin IS NOT NULL AND " ADMIN_SESSION_LOCAL ")) AND NOT "   \
	"coalesce(a.backend_type = 'walsender' AND a.datid IS NOT NULL AND "   \
	"a.query LIKE 'START_REPLICATION%', false) AND NOT "                   \
	"EXISTS (SELECT 1 FROM pg_stat_progress_vacuum v WHERE v.pid = "       \
	"a.pid)"
#define ADMIN_SESSION_XMIN_AGE                                                 \
	"CASE WHEN " ADMIN_SESSION_LOCAL                                       \
	" THEN greatest(age(a.backend_xmin), "                                 \
	"age(a.backend_xid)) ELSE age(a.backend_xid) END"
/* Whether the session holds the horizon by its own transaction id (not
 * only by a snapshot that counts another's as running). */
#define ADMIN_SESSION_BY_XID                                                   \
	"coalesce(age(a.backend_xid) >= (" ADMIN_SESSION_XMIN_AGE "), false)"

/*
 * The rows in flight as one relation (docs/design.md §4): those of live
 * lock leases (the rows themselves still say pending; attempts counts the
 * one under way) and those left in_flight by relays of the row lease.
 * Columns: id, type, exchange, leased_by, lease_id, leased_at,
 * lease_expires_at, attempts, max_attempts, seq. T is the quoted table;
 * claims (the quoted claims table) is read only when has_claims. Malloc'd;
 * NULL when out of memory.
 */
char *admin_flight_sql(const char *T, const char *claims, bool has_claims);

/* The relations whose statistics make up those of rel (an SQL regclass
 * expression), each once: rel, and the leaf partitions of a partitioned
 * table or index, whose own statistics Postgres keeps apart (a plain
 * table has no partition tree; a partition named itself is its own
 * leaf, which UNION keeps once). A table's are read with the
 * pg_stat_get_*() functions of each, not from pg_stat_user_tables: that
 * view groups every table of the database before a filter on relid
 * reaches it, 47 ms a read in a database of 15,000 relations against 1.3
 * (docs/benchmark.md, "The gauges' statistics, read per relation"). */
#define ADMIN_STATS_OF(rel)                                                    \
	"(SELECT relid FROM pg_partition_tree(" rel ") WHERE isleaf UNION "    \
	"SELECT " rel ")"

/* The count of blocked keys, 0 when the table has no blocked-keys table. */
char *admin_blocked_count_sql(const struct names *n);

#endif
