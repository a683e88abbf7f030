/* SPDX-License-Identifier: MIT */
/*
 * The guards of the lock lease (docs/design.md §4, "The guards, proven in
 * the C"), each removable at compile time with -DOUTBOX_WITHOUT_<NAME>.
 * Only tests/guards/run.sh defines one: it builds the store's tests with
 * one guard removed at a time and requires the test named for it to fail,
 * as tests/model proves the same of the Promela model. A real build
 * defines none, and each macro below then is the guard itself.
 * Private to src/store/.
 */
#ifndef OUTBOX_GUARDS_H
#define OUTBOX_GUARDS_H

/* G2: a leased row is locked by the lease transaction, and other leases
 * skip it. The lock is what gives the lease transaction its id, which its
 * claim names; without the lock the transaction asks for one, so such a
 * lease still runs and hands its rows out, as the guard's test needs to
 * show what the lock prevents. */
#ifdef OUTBOX_WITHOUT_G2
#define GUARD_LEASE_LOCK ""
#define GUARD_LEASE_XID "pg_current_xact_id()"
#else
#define GUARD_LEASE_LOCK "FOR UPDATE SKIP LOCKED"
#define GUARD_LEASE_XID "pg_current_xact_id_if_assigned()"
#endif

/* G1: the claim is committed before any row is handed over. */
#ifdef OUTBOX_WITHOUT_G1
#define GUARD_CLAIM_BEFORE_HANDOVER 0
#else
#define GUARD_CLAIM_BEFORE_HANDOVER 1
#endif

/* G3: the sweeper charges only the claims whose transaction aborted. */
#ifdef OUTBOX_WITHOUT_G3
#define GUARD_SETTLE_ABORTED_ONLY 0
#else
#define GUARD_SETTLE_ABORTED_ONLY 1
#endif

/* G4: a lease transaction ends when it sits idle past the lease timeout
 * (idle_in_transaction_session_timeout, set by the transaction). */
#ifdef OUTBOX_WITHOUT_G4
#define GUARD_LEASE_IDLE_TIMEOUT 0
#else
#define GUARD_LEASE_IDLE_TIMEOUT 1
#endif

/* F1: a worker's claim never replaces its previous one while that one
 * is unsettled (the previous claim is deleted only once settled). */
#ifdef OUTBOX_WITHOUT_F1
/* The status is still read (the format's argument), and ignored. */
#define GUARD_CLAIM_NO_OVERWRITE "(%s IS NULL OR true)"
#else
#define GUARD_CLAIM_NO_OVERWRITE                                               \
	"(ids = '{}' OR coalesce(%s, 'committed') = 'committed')"
#endif

/* LIVE: a claim is written only while its lease transaction is in
 * progress. A claim that waited past its reply's deadline gives its
 * lease up (rolled back, nothing handed over); run at last, it must not
 * name that aborted lease's rows for the sweeper to charge. */
#ifdef OUTBOX_WITHOUT_LIVE
#define GUARD_CLAIM_LEASE_LIVE "true"
#else
#define GUARD_CLAIM_LEASE_LIVE "pg_xact_status($3::xid8) = 'in progress'"
#endif

/* The fence: a mark runs only inside the lease transaction that holds
 * its rows; one whose transaction ended is refused, never retried on a
 * new session. */
#ifdef OUTBOX_WITHOUT_FENCE
#define GUARD_MARK_FENCED 0
#else
#define GUARD_MARK_FENCED 1
#endif

#endif
