/* SPDX-License-Identifier: MIT */
/*
 * How the relay's statements reach the server, for the process: prepared
 * once a session (OUTBOX_PG_PREPARE=on), once a server connection of a
 * transaction-mode pool (pooled), and what turns the one into the other
 * (a pooler seen as a session connects, a statement refused, a pool that
 * keeps each client's statements itself). The runner (run.c) asks.
 */
#include <stdatomic.h>
#include <string.h>

#include "base/base.h"
#include "store_internal.h"
#include "store_test.h"

/*
 * Set once a named statement a session prepared was gone (26000), or one
 * it had not prepared was there (42P05): the relay's statements do not
 * all reach one server session, as through a transaction-mode pooler
 * (PgBouncer pool_mode = transaction), which runs each transaction on a
 * server connection of its choosing. Prepared again, the statements would
 * fail on one connection after another and the relay would deliver
 * nothing; so from then on every store of the process (those opened later
 * too: a failed open is retried with a new store) runs as with
 * OUTBOX_PG_PREPARE=pooled, and the relay says so once. A direct session
 * never sees either: a store prepares each name once per session. Set
 * too, before any such refusal, when a session connecting finds that a
 * pooler answered it (store_prepare_behind_pooler()).
 */
static atomic_bool prepare_refused;

/*
 * Set once the pool ended a session for running a statement by a name it
 * had not prepared (08P01, "prepared statement did not exist"), which is
 * how pooled first runs each one: such a pool keeps each client's
 * prepared statements itself (PgBouncer 1.21 and later with
 * max_prepared_statements, on by default from 1.24) and prepares them on
 * whichever server connection it hands out under names of its own, where
 * the probe finds none of the relay's. It does for the relay what pooled
 * does, so from then on every store of the process runs as with
 * OUTBOX_PG_PREPARE=on, and the relay says so once. The refusal comes
 * before the statement ran, and the pool closes the session, so each
 * session meets it at most once.
 */
static atomic_bool pool_keeps_statements;

/*
 * OUTBOX_PG_PREPARE=pooled (docs/design.md §7): a transaction-mode pooler
 * keeps a server connection for a transaction only, but what a
 * transaction prepares stays on that connection. So the lease
 * transaction, the one that runs every batch and whose statements cost
 * the most to plan, asks as it opens which of the relay's statements
 * its connection has (the probe, in the same round trip as its
 * settings), and prepares the others there before their first use; the
 * lease itself runs by name at once and, on a connection without it
 * (26000, the transaction then holds nothing), the transaction opens
 * again and asks first. A statement outside any transaction cannot ask
 * first (run.c, run_autocommit_pooled()); those of the other explicit
 * transactions run unnamed, since a name found missing there would
 * abort the whole transaction.
 */
bool store_pooled(const struct store *s)
{
	return s->opt.prepare && !atomic_load(&pool_keeps_statements) &&
	       (s->opt.prepare_pooled || atomic_load(&prepare_refused));
}

bool store_preparing(const struct store *s)
{
	if (store_pooled(s))
		return s->ses->leasing == s && s->pool_have;
	return s->opt.prepare;
}

void store_stop_preparing(const char *why)
{
	if (!atomic_exchange(&prepare_refused, true))
		log_error("%s: the relay's statements do not all reach one "
			  "Postgres session, as through a transaction-mode "
			  "pooler (PgBouncer pool_mode = transaction), where "
			  "OUTBOX_PG_PREPARE=on cannot work; the relay now "
			  "prepares its statements once a server connection, "
			  "as with OUTBOX_PG_PREPARE=pooled: set that to say "
			  "so",
			  why);
}

void store_prepare_behind_pooler(long server_pid, int announced_pid)
{
	if (!atomic_exchange(&prepare_refused, true))
		log_info("the relay's session to Postgres goes through a "
			 "pooler or proxy (the server process answering, pid "
			 "%ld, is not the one the connection announced, %d): "
			 "the relay prepares its statements once a server "
			 "connection, as with OUTBOX_PG_PREPARE=pooled, which "
			 "a transaction-mode pool (PgBouncer pool_mode = "
			 "transaction) needs, unless the pool shows it keeps "
			 "each client's prepared statements itself (PgBouncer "
			 "1.21 or later with max_prepared_statements), where "
			 "it goes back to on",
			 server_pid, announced_pid);
}

void store_pool_keeps_statements(void)
{
	atomic_store(&pool_keeps_statements, true);
}

bool store_prepare_mode_known(void)
{
	return atomic_load(&prepare_refused) ||
	       atomic_load(&pool_keeps_statements);
}

/* Learns from res, a failure that closed s's session (why: as worded),
 * whether the pool keeps prepared statements itself (see
 * pool_keeps_statements). */
void store_notice_pool_keeps(const struct store *s, const PGresult *res,
			     const char *why)
{
	if (!res || !store_pooled(s))
		return;
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	if (!state || strcmp(state, "08P01") != 0 || !msg ||
	    !strstr(msg, "prepared statement"))
		return;
	if (atomic_exchange(&pool_keeps_statements, true))
		return;
	if (s->opt.prepare_pooled)
		log_error("%s: the pool keeps each client's prepared "
			  "statements itself (PgBouncer 1.21 or later with "
			  "max_prepared_statements), where "
			  "OUTBOX_PG_PREPARE=pooled cannot work; the relay now "
			  "prepares its statements once a session, as with "
			  "OUTBOX_PG_PREPARE=on: set that to say so",
			  why);
	else
		/* A relay at on, turned to pooled by the pooler it saw. */
		log_info("%s: the pool keeps each client's prepared "
			 "statements itself (PgBouncer 1.21 or later with "
			 "max_prepared_statements); the relay prepares its "
			 "statements once a session again, as "
			 "OUTBOX_PG_PREPARE=on says",
			 why);
}
