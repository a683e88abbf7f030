/*
 * SPDX-License-Identifier: MIT
 *
 * The "lock lease" row protocol, checked by spin (docs/model.md says what
 * is modeled, what is abstracted away, and what each run finds).
 *
 * Two relays (each a worker: a main transaction M, a claim session K and
 * a claim row in C), a sweeper and a cleaner over three outbox rows:
 *   row 0, row 1: one partition key, row 0 first (ordered mode, skip);
 *   row 2: no key; in half of the runs a poison row that crashes every
 *          relay that hands it to the broker.
 * Time is abstracted away: every pending row is due. What a database
 * statement or transaction does is one indivisible step (d_step); the
 * relays, the sweeper and the cleaner interleave between such steps. The
 * lease is two: its statement reads the dead claims' rows when it starts,
 * and locks rows later. A relay's marks are invisible to everyone until
 * its COMMIT, so they are applied at the COMMIT step; a mark that fails
 * is a step of its own that aborts the transaction, the relay living on.
 *
 * Properties, all assertions (the checker process runs once nothing
 * else can move; spin's invalid-end-state check backs it up):
 *   P1  a mark only moves a pending row; at quiescence every row was
 *       acked and is sent or deleted, or failed;
 *   P2  at quiescence no row is locked and no dead claim holds ids;
 *   P3  every mark is made under the row lock of the committing
 *       transaction: a relay whose transaction died marks nothing;
 *   P4  row 1 is handed to the broker only after row 0 is sent, deleted
 *       or failed;
 *   P5  the sweeper never charges more crashes than happened to a row,
 *       and never a row that a relay gave back without handing it over
 *       (a lease it ended itself, a released row); a crash record is never
 *       overwritten before the sweeper settled it; the poison row crashes
 *       at most MAXA + NSLOT live relays;
 *   P6  a row named by a dead claim the sweeper has not settled is not
 *       leased (it comes back only through the settle, as a suspect).
 *
 * Guards: a mutant is this model built with one switch (check.sh):
 *   NO_G1     the claim is written after publishing, not before
 *   NO_G2     no row lock (no FOR UPDATE SKIP LOCKED)
 *   NO_G3     the sweeper settles claims without asking pg_xact_status
 *   NO_G4     no idle_in_transaction_session_timeout: a stalled session
 *             keeps its locks
 *   NO_G5     the head marker moves when the broker acks row 0, before
 *             the transaction that marks it commits
 *   NO_FENCE  a stale relay's marks are applied (on a new session)
 * The C before issue 25 (docs/model.md):
 *   EARLY_ONLY  the lease's dead-claims exclusion is read once, when its
 *               statement starts, and rows are locked later; not again
 *               after the locks (the C now checks again once it holds them)
 *   OLD_SETTLE  a settle of several dead claims charges a row named by
 *               more than one of them once (the C now charges per claim)
 *   NO_RELEASE  a lease the relay ends itself after its claim committed
 *               (the claim's reply lost), and rows it did not hand over,
 *               stay in the claim (the C now takes them out first)
 * A pool with no server connection to spare (docs/design.md §4):
 *   NO_LIVE     a claim whose reply came too late, its lease given up
 *               and rolled back, is written when it runs at last (the C
 *               writes a claim only while its lease is in progress)
 *   LATE_WINDOW the late claim's window: a claim that passed its LIVE
 *               test before the rollback commits after it (a fault)
 *   LATE_UNCOUNTED  with LATE_WINDOW, the window is not budgeted as a
 *               crash: the sweep's charge in it is seen
 *   NO_P6       P6 is not checked (to see what EARLY_ONLY leads to)
 * The key lock, ordered mode's lease since the head marker
 * (docs/design.md §6):
 *   KEYLOCK     no head marker: the lease takes a key's row when it is
 *               the key's first live row, as the statement's snapshot
 *               saw it, and locks it only in the version it read
 *   KEYMAP      with KEYLOCK, the key map: each relay keeps the key's
 *               floor, the first row it looks at (the key's first live
 *               row as its previous statement saw it, past both when it
 *               had none), and lowers it to row 0 when row 0 was made
 *               live since that statement began (the discovery of rows
 *               written since its snapshot's xmin)
 *               and, once its marks commit, moves it past the key's
 *               first live row when it finished that row (sent,
 *               deleted, failed)
 *   KEYMAP_NO_DISC  the map without the discovery
 *   KEYSHARE    with KEYMAP, the two relays are sessions of one process,
 *               which share the floors' moves: a relay that finished the
 *               key's row i queues for the other (from: the floor its
 *               statement read from; i; whether row 0 was made live
 *               since that statement began), and the other, before its
 *               next statement, moves its floor past i when it lies in
 *               [from, i], lowering its discovery to the finisher's
 *               (the newest move only: older ones are dropped)
 *   KEYSHARE_NO_DISC  a shared move without the finisher's discovery
 *   KEYSHARE_ANY_FROM  a shared move from any floor at or below i
 *               (neither is caught here: row 0 becomes live again only
 *               by a redrive, which every relay's discovery sees; they
 *               guard rows committed late, which the model has not)
 *   KEYSHARE_EAGER  a move shared for a row handed over, finished or
 *               not (a nack too)
 *   KEYMAP_EAGER_FLOOR  the floor moves past a row the lease marked,
 *               finished or not (a nack too)
 *   KEY_EARLY   the snapshot's look only (its known race with a redrive)
 *   REDRIVE_NO_WRITE  the redrive locks row 1 but leaves it as it is, so
 *               the lock's version check has nothing to see
 *   REDRIVE     an operator redrives row 0 once, after it finished: it
 *               locks row 1 NOWAIT and is refused when row 1 is locked,
 *               sent or deleted; it writes row 1 (under the marker,
 *               demoting its head)
 * The design as first written, which the model refines (docs/model.md):
 *   AS_WRITTEN_UPSERT  the claim upsert overwrites a dead, unsettled claim
 *                      of the same holder (refined, F1: it waits)
 *   AS_WRITTEN_SWEEP   the sweeper empties a dead claim's ids even when a
 *                      row is locked by another relay (refined, F2: a
 *                      locked id stays for the next sweep)
 */

#define NROW 3
#define NRELAY 2
#define NSLOT NRELAY /* one claim row per relay (see CRASH_STEP) */
#define MAXA 2  /* max_attempts of every row */
#ifndef FAULTS
#define FAULTS 2 /* crashes, stalls and lost acks, all relays together */
#endif
/* HISTORY: acked rows are always kept as sent (else both ways).
 * POISON: row 2 crashes every relay that hands it over (a run of its
 * own: with the faults above it would multiply the states). */

/* Row status. DEL: deleted, on ack (no history) or by the cleaner. */
#define PEND 0
#define SENT 1
#define DEL 2
#define FAIL 3

/* pg_xact_status of a claim's xid (C_NONE: no claim, or nothing left in
 * it that anyone reads). */
#define C_NONE 0
#define C_LIVE 1
#define C_DONE 2
#define C_DEAD 3

byte st[NROW];
byte att[NROW];
bit sus[NROW];
bit head[NROW];
byte lk[NROW]; /* 0: unlocked, else relay + 1 holds the row lock in M */
byte cst[NSLOT];
byte cids[NSLOT]; /* bit i: row i is in the claim */
byte faults = FAULTS;
byte nstop;  /* relays stopped for good (at most NRELAY - 1) */
bit history; /* 1: acked rows become sent; 0: deleted */
bit poison;  /* row 2 crashes whoever hands it over */

/* Ghost state, for the assertions. credit[i]: crashed batches holding
 * pending row i that the sweeper may still charge; kept only while the
 * row is pending; saturates at CREDIT_MAX (then it is not checked). */
#define CREDIT_MAX 3
byte credit[NROW];
/* owed[i]: transactions that handed row i to the broker and then died,
 * not yet charged; kept only while the row is pending. */
#define OWED_MAX 3
byte owed[NROW];
/* REDRIVE: the operator may still redrive row 0 */
bit redrive_open;
/* Row 1's version: the redrive writes row 1 (a new version), and the
 * key lock's lock takes row 1 only in the version its statement read. */
bit ver1;
/* KEYMAP: each relay's floor for the key (0: row 0 on, 1: row 1 on, 2:
 * the key is not in its map; 0 at first, as a build reads from the
 * start) and whether row 0 was made live since its last statement
 * began. The map is never built anew here: a floor that lasts is the
 * harder case. */
byte kfl[NRELAY];
bit kdisc[NRELAY];
#ifdef KEYSHARE
/* The floor each relay's last statement read from, and the move queued
 * for relay o (the newest): from, row, and whether row 0 was made live
 * since the finisher's statement began. */
byte kfrom[NRELAY];
bit rq_n[NRELAY];
byte rq_from[NRELAY];
bit rq_i[NRELAY];
bit rq_disc[NRELAY];
#endif

#ifdef NO_G2
#define UNLOCKED(i) 1
#else
#define UNLOCKED(i) (lk[i] == 0)
#endif
#ifdef NO_FENCE
#define FENCE_OFF 1
#else
#define FENCE_OFF 0
#endif
#ifdef AS_WRITTEN_UPSERT
#define UPSERT_OVERWRITES 1
#define SET_FRESH(v) fresh = v
#else
#define UPSERT_OVERWRITES 0
#define SET_FRESH(v) skip
#endif

#define ISSET(m, i) (((m) >> (i)) & 1)
#define PENDING(i) (st[i] == PEND)
#ifdef KEYLOCK
/* Row 1 is its key's first live row when row 0 is not live, as the lease
 * statement's snapshot saw it (first1, a relay's own). Unless KEY_EARLY,
 * the lock takes row 1 only in the version that snapshot read (seen1):
 * the redrive that puts row 0 back writes row 1, so Postgres's recheck
 * of the locked row's newest version (xmin) fails (the C's late check,
 * statements_lease.c). */
#ifdef KEY_EARLY
#define FIRST1 first1
#else
#define FIRST1 (first1 && seen1 == ver1)
#endif
#define ELIG(i) (PENDING(i) && UNLOCKED(i) && (i != 1 || FIRST1))
/* Its snapshot had row 0 live, and it is done since; or row 1 was
 * written since the snapshot read it: a statement that found nothing,
 * and the next one reads anew. */
#ifdef KEYMAP
/* The first row the statement looks at: row 0 when discovered, else the
 * relay's floor; the key's first live row from there, as the snapshot
 * sees it, becomes the floor (2: none, the key leaves the map). */
#define KFROM (kdisc[r] -> 0 : kfl[r])
#define KFIRST                                                             \
	((KFROM == 0 && PENDING(0)) -> 0 : ((KFROM <= 1 && PENDING(1)) -> 1 : 2))
#define SNAP_OLD                                                           \
	((kfl[r] == 0 && !first1 && !PENDING(0)) ||                        \
	 (first1 && seen1 != ver1) || kdisc[r])
#ifdef KEYSHARE
#ifdef KEYSHARE_ANY_FROM
#define SHARE_FROM_OK(j) 1
#else
#define SHARE_FROM_OK(j) (rq_from[j] <= kfl[r])
#endif
#ifdef KEYSHARE_NO_DISC
#define SHARE_DISC(j) skip
#else
#define SHARE_DISC(j) kdisc[r] = kdisc[r] | rq_disc[j]
#endif
#define APPLY_ONE(j)                                                       \
	if                                                                 \
	:: SHARE_FROM_OK(j) && kfl[r] <= rq_i[j] ->                        \
		kfl[r] = rq_i[j] + 1;                                      \
		SHARE_DISC(j)                                              \
	:: else -> skip                                                    \
	fi
#define APPLY_SHARED                                                       \
	if                                                                 \
	:: rq_n[r] == 1 -> APPLY_ONE(r)                                    \
	:: else -> skip                                                    \
	fi;                                                                \
	rq_n[r] = 0;                                                       \
	rq_from[r] = 0;                                                    \
	rq_i[r] = 0;                                                       \
	rq_disc[r] = 0;                                                    \
	kfrom[r] = KFROM;
#else
#define APPLY_SHARED skip;
#endif
#define SNAP1                                                              \
	APPLY_SHARED                                                       \
	kfl[r] = KFIRST;                                                   \
	first1 = (kfl[r] == 1);                                            \
	seen1 = ver1;                                                      \
	kdisc[r] = 0
/* At the COMMIT of its marks: past row i when it was the floor and this
 * lease finished it (handed over, no longer pending). */
#ifdef KEYMAP_EAGER_FLOOR
#define PASSED(i) ISSET(handed, i)
#else
#define PASSED(i) (ISSET(handed, i) && !PENDING(i))
#endif
#ifdef KEYSHARE
#ifdef KEYSHARE_EAGER
#define SHARED(i) ISSET(handed, i)
#else
#define SHARED(i) PASSED(i)
#endif
/* Queued for the other relay, 1 - r: the newest move only, as a store
 * further behind than the C's ring skips the older ones. */
#define SHARE_PAST(i)                                                      \
	if                                                                 \
	:: SHARED(i) ->                                                    \
		rq_from[1 - r] = kfrom[r];                                 \
		rq_i[1 - r] = i;                                           \
		rq_disc[1 - r] = kdisc[r];                                 \
		rq_n[1 - r] = 1                                            \
	:: else -> skip                                                    \
	fi
#else
#define SHARE_PAST(i) skip
#endif
#define FLOOR_PAST                                                         \
	SHARE_PAST(0);                                                     \
	SHARE_PAST(1);                                                     \
	if                                                                 \
	:: kfl[r] == 0 && PASSED(0) -> kfl[r] = 1                          \
	:: kfl[r] == 1 && PASSED(1) -> kfl[r] = 2                          \
	:: else -> skip                                                    \
	fi
#else
#define SNAP_OLD ((!first1 && !PENDING(0)) || (first1 && seen1 != ver1))
#define SNAP1 first1 = !PENDING(0); seen1 = ver1
#define FLOOR_PAST skip
#endif
#else
#define SNAP_OLD 0
#define SNAP1 skip
#define FLOOR_PAST skip
#define ELIG(i) (PENDING(i) && UNLOCKED(i) && (i == 2 || head[i]))
#endif
#define ALLDONE (!PENDING(0) && !PENDING(1) && !PENDING(2))
#ifdef REDRIVE
#define REDRIVE_ON 1
#else
#define REDRIVE_ON 0
#endif
/* A relay stops once every row is done and no redrive can come. */
#define QUIET (ALLDONE && !redrive_open)
#define PMASK (PENDING(0) | (PENDING(1) << 1) | (PENDING(2) << 2))
/* pending and locked: the sweeper's SKIP LOCKED leaves it alone */
#define LP(i) (PENDING(i) && !UNLOCKED(i))
#define LPMASK (LP(0) | (LP(1) << 1) | (LP(2) << 2))
/* a dead claim with ids: the sweeper has not settled it yet */
#define UNSETTLED(s) (cst[s] == C_DEAD && cids[s] != 0)
/* row i is named by such a claim */
#define INDEAD(i)                                                          \
	((UNSETTLED(0) && ISSET(cids[0], i)) ||                            \
	 (UNSETTLED(1) && ISSET(cids[1], i)))
#define DEADMASK (INDEAD(0) | (INDEAD(1) << 1) | (INDEAD(2) << 2))

/* What the lease may return: any non-empty set of due, unlocked rows
 * (ordered: unkeyed rows and key heads) with at most one suspect. */
#define OKROW(m, i) (!ISSET(m, i) || ELIG(i))
#define NSUS(m)                                                            \
	((ISSET(m, 0) && sus[0]) + (ISSET(m, 1) && sus[1]) +               \
	 (ISSET(m, 2) && sus[2]))
#define VALID(m) (OKROW(m, 0) && OKROW(m, 1) && OKROW(m, 2) && NSUS(m) <= 1)

/* A row leaves pending for good. The mark that finishes row 0 (sent, or
 * failed under skip) sets head on the key's next row in the same
 * statement (§6). */
#define FINISH(i, to)                                                      \
	st[i] = to;                                                        \
	credit[i] = 0;                                                     \
	owed[i] = 0;                                                       \
	if                                                                 \
	:: i == 0 -> head[0] = 0; head[1] = 1                              \
	:: else -> skip                                                    \
	fi

/* The settle's charge of row i for k dead claims naming it: attempts
 * + k, suspect, failed when the attempts are spent. Never more charges
 * than crashes. */
#define CHARGE(i)                                                          \
	assert(PENDING(i));                                                \
	if                                                                 \
	:: credit[i] < CREDIT_MAX ->                                       \
		assert(credit[i] >= k); credit[i] = credit[i] - k          \
	:: else -> skip                                                    \
	fi;                                                                \
	if                                                                 \
	:: owed[i] >= k -> owed[i] = owed[i] - k                           \
	:: else -> owed[i] = 0                                             \
	fi;                                                                \
	att[i] = att[i] + k;                                               \
	sus[i] = 1;                                                        \
	if                                                                 \
	:: att[i] >= MAXA -> FINISH(i, FAIL)                               \
	:: else -> skip                                                    \
	fi

/* Each pending row that the claim of a transaction that died names
 * may be charged once: the rows it held, less those it gave back. */
#define CREDIT1(i)                                                         \
	if                                                                 \
	:: ISSET(cids[slot], i) && PENDING(i) && credit[i] < CREDIT_MAX -> \
		credit[i]++                                                \
	:: else -> skip                                                    \
	fi
#define CREDIT_BATCH CREDIT1(0); CREDIT1(1); CREDIT1(2)
#define OWE1(i)                                                            \
	if                                                                 \
	:: ISSET(handed, i) && PENDING(i) && owed[i] < OWED_MAX ->         \
		owed[i]++                                                  \
	:: else -> skip                                                    \
	fi

#define UNLOCK1(i)                                                         \
	if                                                                 \
	:: lk[i] == me -> lk[i] = 0                                        \
	:: else -> skip                                                    \
	fi
#define UNLOCK_ALL UNLOCK1(0); UNLOCK1(1); UNLOCK1(2)

/* M's transaction ends without commit: its row locks vanish, and the xid
 * of the claim, if one was written for it, is now aborted. */
#define ABORT_TXN                                                          \
	if                                                                 \
	:: alive ->                                                        \
		UNLOCK_ALL;                                                \
		OWE1(0); OWE1(1); OWE1(2);                                 \
		if                                                         \
		:: claimed -> cst[slot] = C_DEAD; CREDIT_BATCH             \
		:: else -> skip                                            \
		fi;                                                        \
		alive = 0                                                  \
	:: else -> skip                                                    \
	fi

/* The relay ends its transaction itself before handing anything over
 * (store_lease_abort, a claim whose reply was lost): nothing to charge,
 * so no credit. */
#define ABORT_QUIET                                                        \
	if                                                                 \
	:: alive ->                                                        \
		UNLOCK_ALL;                                                \
		if                                                         \
		:: claimed -> cst[slot] = C_DEAD                           \
		:: else -> skip                                            \
		fi;                                                        \
		alive = 0                                                  \
	:: else -> skip                                                    \
	fi

/* A crash: the process dies. Its successor is a new holder (new pid)
 * with a claim row of its own; the model reuses the relay's one claim
 * row, and the successor leases only once the sweeper settled the dead
 * claim there (so no claim is ever lost to this reuse). */
#define CRASH_STEP                                                         \
	ABORT_TXN;                                                         \
	SET_FRESH(1)

/* A stall past the lease (SIGSTOP, a hung call): the server's
 * idle_in_transaction_session_timeout kills M's session (G4). The relay
 * may never come back, or wake up later, stale (see "stale:" below). */
#ifndef NO_G4
#define STALL                                                              \
	d_step { ABORT_TXN; handed = 0 };                                  \
	if                                                                 \
	:: goto stale                                                      \
	:: d_step { nstop < NRELAY - 1 -> nstop++ }; goto stopped         \
	fi
#else
#define STALL                                                              \
	if                                                                 \
	:: d_step { nstop < NRELAY - 1 -> nstop++ }; goto stopped         \
	:: else -> skip                                                    \
	fi
#endif

/* A crash or a stall may happen between any two statements. */
#define MAYBE_FAULT                                                        \
	if                                                                 \
	:: d_step { alive && faults > 0 -> faults--; CRASH_STEP };         \
		goto idle                                                  \
	:: d_step { alive && faults > 0 -> faults-- }; STALL              \
	:: skip                                                            \
	fi

/* K's autocommit upsert of the claim row (G1: before any handover). If
 * it fails, M rolls back and nothing is published; if it committed but
 * its reply was lost, the relay takes every row out of the claim again,
 * then rolls M back (NO_RELEASE: only rolls back). A stale relay's K
 * still works: it writes a claim whose xid is already aborted. */
#define CLAIM_UPSERT                                                       \
	assert(!(cst[slot] == C_DEAD && (cids[slot] & PMASK) != 0));       \
	cids[slot] = batch;                                                \
	claimed = 1;                                                       \
	if                                                                 \
	:: alive -> cst[slot] = C_LIVE                                     \
	:: else -> cst[slot] = C_DEAD; CREDIT_BATCH                        \
	fi
#ifdef NO_RELEASE
#define RELEASE_ALL skip
#else
#define RELEASE_ALL d_step { cids[slot] = 0 }
#endif
/* K's reply did not come in time (a pooler whose every server
 * connection is held by a lease waiting for its claim): M rolls back
 * first, nothing handed over, and the claim runs after. It writes
 * nothing, its lease no longer in progress (LIVE); NO_LIVE: it writes a
 * claim whose xid is aborted, naming rows never handed over. */
#define DEAD_CLAIM cids[slot] = batch; claimed = 1; cst[slot] = C_DEAD
#ifdef NO_LIVE
#define LATE_CLAIM d_step { DEAD_CLAIM }
#else
#define LATE_CLAIM skip
#endif
/* The late claim's window (docs/design.md §4, "A pool with no
 * connection to spare"): the claim passed its LIVE test while M was in
 * progress, M rolls back first, and the claim commits after: written,
 * its xid aborted, naming rows never handed over. Its reply says so and
 * the relay takes every row out of it at once; a sweep in between
 * charges them once, as a crash would, so the window spends a fault and
 * credits the batch as a crash does. Rows the release finds still in
 * the claim were not charged: their credit goes with them.
 * Only under LATE_WINDOW (its own runs: with a redrive, the sweep may
 * charge a row another relay finished and the operator redrove in the
 * window, docs/model.md). LATE_UNCOUNTED: no credit, to show that the
 * sweep's charge is there. */
#ifdef LATE_UNCOUNTED
#define LATE_CREDIT skip
#define LATE_UNCREDIT skip
#else
#define LATE_CREDIT CREDIT_BATCH
#define UNCREDIT1(i)                                                       \
	if                                                                 \
	:: ISSET(cids[slot], i) && PENDING(i) && credit[i] > 0 &&          \
	    credit[i] < CREDIT_MAX -> credit[i]--                          \
	:: else -> skip                                                    \
	fi
#define LATE_UNCREDIT UNCREDIT1(0); UNCREDIT1(1); UNCREDIT1(2)
#endif
#ifdef NO_RELEASE
#define LATE_RELEASE skip
#else
#define LATE_RELEASE d_step { LATE_UNCREDIT; cids[slot] = 0 }
#endif
#ifdef LATE_WINDOW
#define LATE_WINDOW_BRANCH :: LATE_COMMIT; goto idle
#else
#define LATE_WINDOW_BRANCH
#endif
#define LATE_COMMIT                                                        \
	d_step { alive && faults > 0 -> faults--; ABORT_QUIET };          \
	d_step { DEAD_CLAIM; LATE_CREDIT };                                \
	LATE_RELEASE
#define WRITE_CLAIM                                                        \
	if                                                                 \
	:: alive -> d_step { ABORT_QUIET }; goto idle /* K failed */       \
	:: alive -> d_step { ABORT_QUIET }; LATE_CLAIM; goto idle          \
	LATE_WINDOW_BRANCH                                                 \
	:: d_step { alive && faults > 0 -> faults--; CLAIM_UPSERT };       \
		RELEASE_ALL; /* committed, its reply lost */               \
		d_step { ABORT_QUIET };                                    \
		goto idle                                                  \
	:: d_step { CLAIM_UPSERT }                                         \
	fi

/* 1. M: BEGIN; SELECT due rows FOR UPDATE SKIP LOCKED LIMIT n. Nothing
 * is written: the rows stay pending, locked by M. A relay waits while
 * its claim row holds a dead, unsettled claim (F1). */
#ifdef NO_G2
#define LOCK_BATCH skip
#else
#define LOCK1(i)                                                           \
	if                                                                 \
	:: ISSET(batch, i) -> lk[i] = me                                   \
	:: else -> skip                                                    \
	fi
#define LOCK_BATCH LOCK1(0); LOCK1(1); LOCK1(2)
#endif
/* The rows of dead claims are left out twice: as the statement read
 * them when it started (excl), and as they are once the rows are locked
 * (a lease that died in between has its rows unlocked and its claim
 * dead). EARLY_ONLY: the first only. */
#ifdef EARLY_ONLY
#define LATE_OK(m) 1
#else
#define LATE_OK(m) ((m & DEADMASK) == 0)
#endif
#ifdef NO_P6
#define P6(m) skip
#else
#define P6(m) assert((m & DEADMASK) == 0)
#endif
#define LEASE(m)                                                           \
	d_step {                                                           \
		(!UNSETTLED(slot) || (UPSERT_OVERWRITES && !fresh)) &&     \
		    VALID(m) && (m & excl) == 0 && LATE_OK(m) ->           \
		P6(m);                                                     \
		excl = 0;                                                  \
		batch = m;                                                 \
		LOCK_BATCH;                                                \
		alive = 1;                                                 \
		SET_FRESH(0)                                               \
	}

/* 3. Hand row i to the broker (or not: destination refused or paused,
 * past the local deadline: no statement, no charge). A stale relay
 * publishes too. Then a fault may strike. */
#ifdef NO_G5
/* the mutant moves the head as soon as the broker acks row 0, before
 * the transaction that marks it commits */
#define EARLY_HEAD(i)                                                      \
	if                                                                 \
	:: i == 0 -> d_step { ack = 1; head[0] = 0; head[1] = 1 }         \
	:: skip                                                            \
	fi
#else
#define EARLY_HEAD(i) skip
#endif
#define PUBLISH(i)                                                         \
	if                                                                 \
	:: ISSET(batch, i) ->                                              \
		if                                                         \
		:: skip                                                    \
		:: poison && i == 2 ->                                     \
			d_step {                                           \
				handed = handed | (1 << i);                \
				CRASH_STEP                                 \
			};                                                 \
			goto idle                                          \
		:: !(poison && i == 2) ->                                  \
			d_step {                                           \
				/* P4: row 1 reaches the broker only after \
				 * row 0 is sent, deleted or failed */     \
				assert(i != 1 || st[0] != PEND);           \
				handed = handed | (1 << i)                 \
			};                                                 \
			EARLY_HEAD(i)                                      \
		fi;                                                        \
		MAYBE_FAULT                                                \
	:: else -> skip                                                    \
	fi

/* 4. One statement per outcome class, in M. The broker's answer is
 * chosen here: nothing reads it before. acked: DELETE, or UPDATE to sent
 * (history); nack: attempts + 1, failed when spent; ack lost (outcome
 * unknown, transport): attempts + 1, never failed for it; permanent:
 * failed at once. */
#ifdef NO_G2
#define HOLDS(i) skip
#else
#define HOLDS(i) assert(lk[i] == me) /* P3 */
#endif
#define ACKED(i)                                                           \
	if                                                                 \
	:: history -> FINISH(i, SENT)                                      \
	:: else -> FINISH(i, DEL)                                          \
	fi
#define MARK(i)                                                            \
	if                                                                 \
	:: ISSET(handed, i) ->                                             \
		HOLDS(i);                                                  \
		assert(PENDING(i)); /* P1: nobody finished it meanwhile */ \
		sus[i] = 0;                                                \
		if                                                         \
		:: ack && i == 0 -> ACKED(i)                               \
		:: !(ack && i == 0) -> ACKED(i) /* once or twice */        \
		:: !(ack && i == 0) -> att[i]++; /* nack */                \
			if                                                 \
			:: att[i] >= MAXA -> FINISH(i, FAIL)               \
			:: else -> skip                                    \
			fi                                                 \
		:: !(ack && i == 0) && faults > 0 -> faults--; /* lost */  \
			if                                                 \
			:: att[i] <= MAXA -> att[i]++                      \
			:: else -> skip                                    \
			fi                                                 \
		:: !(ack && i == 0) -> FINISH(i, FAIL) /* permanent */    \
		fi                                                         \
	:: else -> skip                                                    \
	fi

/* Before its marks the relay takes the rows it did not hand over out of
 * its claim (the release); NO_RELEASE: they stay. */
#ifdef NO_RELEASE
#define RELEASE_UNHANDED skip
#else
#define RELEASE_UNHANDED                                                   \
	if                                                                 \
	:: claimed -> cids[slot] = cids[slot] & (handed | ~batch)         \
	:: else -> skip                                                    \
	fi
#endif

/* 5. COMMIT. The claim row is not touched: its xid is now committed,
 * which marks the claim done (so, in the model, nothing is left in it
 * to read, but for the G3 mutant). A stale relay's session is gone: its
 * COMMIT fails (the fence). */
#ifdef NO_G3
#define CLAIM_DONE cst[slot] = C_DONE
#else
#define CLAIM_DONE cst[slot] = C_NONE; cids[slot] = 0
#endif

/* A settle (the sweeper's statement: every dead claim at once; a relay's
 * own: dm is its claim alone) charges each id still pending and not
 * locked once per dead claim naming it (OLD_SETTLE: once); a locked one
 * stays for the next sweep (F2); one no longer pending is dropped. An
 * emptied claim is done. dm: the claims it settles. */
#ifdef NO_G3
#define SWEEPABLE(s) (cids[s] != 0)
#else
#define SWEEPABLE(s) UNSETTLED(s)
#endif
#ifdef AS_WRITTEN_SWEEP
#define WORK(s) SWEEPABLE(s)
#define KEEP_LOCKED(i) DROP(0, i); DROP(1, i)
#else
#define WORK(s) (SWEEPABLE(s) && (cids[s] & ~LPMASK) != 0)
#define KEEP_LOCKED(i) skip
#endif
#ifdef OLD_SETTLE
#define ONCE if :: k > 1 -> k = 1 :: else -> skip fi
#else
#define ONCE skip
#endif
#define INCL(s, i) (ISSET(dm, s) && ISSET(cids[s], i))
#define DROP(s, i)                                                         \
	if                                                                 \
	:: ISSET(dm, s) -> cids[s] = cids[s] & ~(1 << i)                   \
	:: else -> skip                                                    \
	fi
#define SETTLE_ROW(i)                                                      \
	k = INCL(0, i) + INCL(1, i);                                       \
	if                                                                 \
	:: k > 0 && PENDING(i) && UNLOCKED(i) ->                           \
		ONCE;                                                      \
		CHARGE(i);                                                 \
		DROP(0, i);                                                \
		DROP(1, i)                                                 \
	:: k > 0 && PENDING(i) && !UNLOCKED(i) -> KEEP_LOCKED(i)           \
	:: k > 0 && !PENDING(i) -> DROP(0, i); DROP(1, i)                  \
	:: else -> skip                                                    \
	fi
#define DONE_IF_EMPTY(s)                                                   \
	if                                                                 \
	:: ISSET(dm, s) && cids[s] == 0 -> cst[s] = C_NONE                 \
	:: else -> skip                                                    \
	fi
#define SETTLE_BODY                                                        \
	SETTLE_ROW(0);                                                     \
	SETTLE_ROW(1);                                                     \
	SETTLE_ROW(2);                                                     \
	DONE_IF_EMPTY(0);                                                  \
	DONE_IF_EMPTY(1);                                                  \
	k = 0;                                                             \
	dm = 0

proctype relay(byte r)
{
	byte me = r + 1;
	byte slot = r;
	byte batch, handed;
	byte excl; /* rows of dead claims as the lease statement began */
	bit first1; /* KEYLOCK: row 0 was not live as it began */
	bit seen1;  /* KEYLOCK: the version of row 1 it read then */
	byte k, dm; /* settling its own claim */
	bit alive, claimed, fresh;
	bit ack; /* NO_G5 only: row 0 acked before its commit */

idle:
	atomic { batch = 0; handed = 0; ack = 0; claimed = 0 };
	if
	:: QUIET -> goto finished
	/* Its last lease died and the session lived on (or came back): the
	 * relay settles that claim itself, as the sweeper would. */
	:: d_step {
		UNSETTLED(slot) && !(UPSERT_OVERWRITES && !fresh) &&
		    WORK(slot) ->
		dm = 1 << slot;
		SETTLE_BODY
	   };
		goto idle
	/* The lease statement begins: the dead claims' rows as it sees them
	 * (excl). */
	:: d_step { excl = DEADMASK; SNAP1 }
	fi;
	if
	:: LEASE(1)
	:: LEASE(2)
	:: LEASE(3)
	:: LEASE(4)
	:: LEASE(5)
	:: LEASE(6)
	:: LEASE(7)
	/* what it left out has been settled since: a new statement */
	:: d_step { (excl & ~DEADMASK) != 0 -> excl = 0 }; goto idle
	:: d_step { SNAP_OLD -> excl = 0 }; goto idle
	:: QUIET -> goto finished
	fi;
#ifndef NO_G1
	/* 2. The claim, committed before any handover (G1). */
	WRITE_CLAIM;
	MAYBE_FAULT;
#endif
	PUBLISH(0);
	PUBLISH(1);
	PUBLISH(2);
#ifdef NO_G1
	WRITE_CLAIM;
	MAYBE_FAULT;
#endif
commit:
	skip;
	d_step { RELEASE_UNHANDED };
	if
	:: alive || FENCE_OFF ->
		if
		/* A mark fails: the transaction aborts and the relay lives
		 * on (its claim is dead; it settles it before its next). */
		:: d_step { alive && faults > 0 -> faults--; ABORT_TXN };
			goto idle
		:: skip
		fi;
		atomic {
			MARK(0);
			MARK(1);
			MARK(2);
			if
			:: alive -> UNLOCK_ALL; CLAIM_DONE; FLOOR_PAST; alive = 0
			:: else -> skip
			fi
		}
	:: else -> skip /* the COMMIT of a stale relay fails */
	fi;
	goto idle;

	/* A stale relay wakes up not knowing that its session is gone: it
	 * hands the rest of its batch to the broker (at worst all of it,
	 * again), then its COMMIT fails. */
stale:
	atomic {
		/* P4. A redrive may have put row 0 back since this relay's
		 * session died and let go of row 1: what the stale relay
		 * hands over was leased in order, and nothing fences it. */
		assert(!ISSET(batch, 1) || st[0] != PEND || REDRIVE_ON);
		handed = batch
	};
	if
	:: FENCE_OFF -> goto commit
	:: else -> goto idle
	fi;

stopped:
end_stopped:
	false;
finished:
	skip
}

proctype sweeper()
{
	byte k, dm;
end_sweep:
	do
	:: d_step {
		WORK(0) || WORK(1) ->
		dm = SWEEPABLE(0) | (SWEEPABLE(1) << 1);
		SETTLE_BODY
	   }
	od
}

/* REDRIVE: `outbox-relay redrive` of row 0, once, after it finished and
 * before the cleaner took it: in one transaction it locks row 1 NOWAIT
 * (refused if a lease holds it), is refused if row 1 is sent or gone
 * (no --force), demotes row 1 if head, and puts row 0 back pending as
 * new, classified its key's head. */
proctype redrive()
{
	if
	:: d_step {
		(st[0] == SENT || st[0] == FAIL) && st[1] == PEND && lk[1] == 0 ->
		head[1] = 0;
#ifndef REDRIVE_NO_WRITE
		ver1 = 1;
#endif
#if defined(KEYMAP) && !defined(KEYMAP_NO_DISC)
		/* Row 0's writer is this transaction: every relay's next
		 * statement began after it, so its discovery reads it. */
		kdisc[0] = 1;
		kdisc[1] = 1;
#endif
#ifdef KEYSHARE
		/* and so does the discovery a shared move lowers to. */
		rq_disc[0] = rq_n[0];
		rq_disc[1] = rq_n[1];
#endif
		head[0] = 1;
		st[0] = PEND;
		att[0] = 0;
		sus[0] = 0;
		credit[0] = 0;
		owed[0] = 0;
		redrive_open = 0
	   }
	:: redrive_open = 0 /* none, or too late */
	fi
}

/* The cleaner deletes sent rows (retention) and failed rows (failed
 * retention); no relay ever holds those. */
proctype cleaner()
{
end_clean:
	do
	:: d_step { st[0] == SENT -> st[0] = DEL }
	:: d_step { st[1] == SENT -> st[1] = DEL }
	:: d_step { st[2] == SENT -> st[2] = DEL }
	:: d_step { st[0] == FAIL -> st[0] = DEL }
	:: d_step { st[1] == FAIL -> st[1] = DEL }
	:: d_step { st[2] == FAIL -> st[2] = DEL }
	od
}

/* P5, at every step: each transaction that handed a pending row to the
 * broker and died is remembered by a dead claim holding the row until
 * the sweeper charged it. (A poison row is therefore failed after
 * MAXA crashes, plus those still recorded.) */
#define NREC1(s, i) (UNSETTLED(s) && ISSET(cids[s], i))
#define NREC(i) (NREC1(0, i) + NREC1(1, i))
#define OWED_OK(i) (!PENDING(i) || owed[i] <= NREC(i))
active proctype monitor()
{
end_monitor:
	atomic { !(OWED_OK(0) && OWED_OK(1) && OWED_OK(2)) -> assert(false) }
}

/* Runs once nothing else can move: relays finished or stopped for good
 * (one at least is not), the sweeper and the cleaner out of work. */
proctype checker()
{
	timeout;
	d_step {
		/* P1, P2: nothing pending, nothing locked */
		assert(ALLDONE);
		assert(lk[0] == 0 && lk[1] == 0 && lk[2] == 0);
		/* P2: no dead claim left unsettled */
		assert(!UNSETTLED(0) && !UNSETTLED(1))
	}
}

init
{
	atomic {
#ifdef HISTORY
		history = 1;
#else
		if
		:: history = 0
		:: history = 1
		fi;
#endif
#ifndef POISON
		poison = 0;
#else
		poison = 1;
#endif
		head[0] = 1;
		run relay(0);
		run relay(1);
		run sweeper();
		run cleaner();
#ifdef REDRIVE
		redrive_open = 1;
		run redrive();
#endif
		run checker()
	}
}
