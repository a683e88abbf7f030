/* SPDX-License-Identifier: MIT */
/*
 * Test fixtures against the real Postgres that tests/run.sh starts
 * (RELAY_TEST_DATABASE_URL). Each test gets its own schema, so test
 * programs run in parallel without seeing each other's rows.
 */
#ifndef OUTBOX_PGTEST_H
#define OUTBOX_PGTEST_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

#include "store/store.h"

/* The database URL; fails the test when unset. */
const char *pgtest_url(void);

/* A new connection; fails the test on error. */
PGconn *pgtest_connect(void);

/* Creates a fresh schema "<prefix>_<pid>_<n>" and migrates
 * schema.outbox_events in it; writes "schema.outbox_events" to table.
 * With RELAY_TEST_PARTITIONED=1 the table is then partitioned by id
 * (pgtest_partitioned()). */
void pgtest_fresh_table(const char *prefix, char *table, size_t len);

/* RELAY_TEST_PARTITIONED=1: the tests run on tables partitioned by id
 * (docs/design.md §11, the migration), a DEFAULT partition and one from
 * the test's start on. */
bool pgtest_partitioned(void);

/* Runs sql (printf-style); fails the test unless it succeeds. */
void pgtest_exec(PGconn *conn, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Runs sql and returns the first column of the first row as a long. */
long pgtest_long(PGconn *conn, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Whether table's storage parameters hold opt, as "fillfactor=70". */
bool pgtest_has_reloption(PGconn *conn, const char *table, const char *opt);

/* Default store options for table (batch 100, lease 60 s, prepare on). */
struct store_options pgtest_store_options(const char *table);

/* Opens a store; fails the test on error. */
struct store *pgtest_store(const struct store_options *opt);

/* How many rows one lease of a store of opt takes; the lease is aborted
 * and the store closed. */
size_t pgtest_lease_count(const struct store_options *opt);

/* Inserts n events of type "test.event" with small JSON payloads. */
void pgtest_insert(PGconn *conn, const char *table, int n);

/* A concurrent build of index name on table (which holds a row) that
 * fails at its first row, as a build cut short does: the index is left
 * invalid. */
void pgtest_failed_index_build(PGconn *conn, const char *name,
			       const char *table);

/*
 * Runs sql (rows written before migration 004) with table's destination
 * CHECK dropped, then adds it back NOT VALID, as 004 leaves it over old
 * pending rows that break it. The table is named outbox_events.
 */
void pgtest_before_004(PGconn *conn, const char *table, const char *sql);

#endif
