/* SPDX-License-Identifier: MIT */
/*
 * The replica registries of a relay's other tables: with several tables
 * (docs/design.md §13) the ops session heartbeats its own source's
 * registry, and this the registry of every other source, so that
 * `status`, `redrive`, `migrate --partition` and the contract steps of
 * each table see the relays that serve it. Through the sessions it holds
 * in other databases it also reads their xmin horizons and their tables'
 * dead tuples for /metrics.
 * Owned and used by the ops thread alone.
 */
#ifndef OUTBOX_OPS_REGISTRIES_H
#define OUTBOX_OPS_REGISTRIES_H

#include <stdbool.h>
#include <stddef.h>

#include "loops/loops.h"
#include "store/store.h"

struct registries;

/* What every registry row of this relay says (store_admin_heartbeat()),
 * and tick, called before each table's statements: the ops thread's
 * liveness for /healthz. */
struct registry_beat {
	const char *id, *version;
	struct store_kept kept;
	bool draining;
	void (*tick)(void);
};

struct registries *registries_new(void);

/*
 * Heartbeats the registry of every source but ops_source: those of
 * ops_store's database through stores sharing its session, those of
 * each other database through stores sharing one session of that
 * database (at most one such session made a call: each may wait for a
 * connect). so: the ops session's options (the table and database are
 * each source's). A table that fails (gone, unmigrated, a grant) or a
 * database out of reach is told once and tried again later; the others
 * go on. A round works for at most a second; the next goes on from where
 * it stopped. STORE_RECONNECT, with err, when the ops session was lost
 * (it then connects again), else 0.
 */
int registries_beat(struct registries *g, struct relay *r,
		    struct store *ops_store, size_t ops_source,
		    const struct store_options *so,
		    const struct registry_beat *beat, char *err, size_t errlen);

/*
 * Reads the xmin horizon of each database other than ops_db whose
 * registries have a session open (a database out of reach, or none of
 * whose tables opened, is not read), and merges it into into, the ops
 * session's gauges: the longest-held holder of them all (its database's
 * index in *held_in, ops_db when the ops session's own), the largest
 * xmin age of each kind. A snapshot held in another database keeps
 * vacuum from that database's outboxes alone, and the ops session's
 * statement does not see it. A holder every database of a server sees
 * (a writer, a prepared transaction, a physical slot, a session of no
 * database) is taken from that server's first read (the ops session's
 * first), a later read of the server names only its own database's
 * holders, so a holder is named with its own database where that is
 * listed, else with the first listed database read on its server.
 * tick: called before each read.
 */
void registries_horizons(struct registries *g, struct relay *r, size_t ops_db,
			 struct store_gauges *into, size_t *held_in,
			 void (*tick)(void));

/*
 * Notes each source's dead tuples (relay_note_dead_tuples()) for
 * /metrics: one statement a database, on ops_store for ops_db and on the
 * session the registries hold in each other database. A database out of
 * reach, or none of whose tables opened, is not read and its sources are
 * noted unknown (no series), as is a source found gone or whose table
 * is not there; a database whose read failed keeps its sources' last
 * values (told once). tick: called before each read. STORE_RECONNECT,
 * with err, when ops_store's session was lost, else 0.
 */
int registries_dead_tuples(struct registries *g, struct relay *r, size_t ops_db,
			   struct store *ops_store, void (*tick)(void),
			   char *err, size_t errlen);

/* Deletes this relay's row from every registry it beats (a clean stop),
 * the ops session's database first, and not there when ops_connected is
 * false (that session was lost). */
void registries_forget(struct registries *g, struct relay *r, size_t ops_source,
		       bool ops_connected, const char *id);

/* Closes the stores of database db: the ops session moves from or to it,
 * and its stores are to share the session the next beat is given there
 * (the other databases' keep theirs). */
void registries_close_db(struct registries *g, struct relay *r, size_t db);

void registries_free(struct registries *g);

#endif
