/* SPDX-License-Identifier: MIT */
/*
 * The unordered lease's turn among the due rows (docs/design.md §4, "The
 * due turn"): where a relay's stores of one table start their due scans.
 *
 * What the turn says: every pending, due row below its key that no lease
 * holds was written by a transaction at or after its late scan's floor,
 * so a lease starting at the key finds it by the late scan; rows a lease
 * holds are that lease's, and come back above the turn or move it back.
 * A lease that starts at the turn (or a rescan, from the start) and
 * takes its due rows up to reach makes that true of reach with the floor
 * it returns: it took every row it could see and nobody held below
 * reach, and the late scan's next floor is at or below the writer of
 * every row it could not see (statements_lease.c, $6). It stops being
 * true when a lease lets rows go where they were: they are free below a
 * turn that others moved past while they were held. So such a lease moves
 * the turn back to its lowest row once its transaction has ended, and a
 * lease that began before a move back does not move the turn on (it
 * stepped over the rows as held), nor does one that began at its own
 * floor.
 */
#include "store_internal.h"
#include "store_test.h"

int store_due_turn_init(struct store_due_turn *t)
{
	t->at_us = INT64_MIN;
	t->seq = INT64_MIN;
	t->written_floor = 0;
	t->gen = 0;
	return pthread_mutex_init(&t->lock, NULL) == 0 ? 0 : -1;
}

void store_due_turn_destroy(struct store_due_turn *t)
{
	pthread_mutex_destroy(&t->lock);
}

/* The callers hold t->lock. */
static bool turn_on(struct store_due_turn *t, uint64_t gen, int64_t at_us,
		    int64_t seq, uint64_t written_floor)
{
	if (t->gen != gen || t->at_us == INT64_MIN ||
	    !due_key_below(t->at_us, t->seq, at_us, seq))
		return false;
	t->at_us = at_us;
	t->seq = seq;
	t->written_floor = written_floor;
	return true;
}

/* The late floor goes back too (written_floor: UINT64_MAX keeps it): a
 * row the lease's late scan read and let go (the byte budget cut it, or
 * the batch had no room after a suspect) lies below the turn, maybe below
 * the rows the lease took, and a lease that stepped over it as held may
 * have moved the turn on with a floor past its writer. */
static void turn_back(struct store_due_turn *t, int64_t at_us, int64_t seq,
		      uint64_t written_floor)
{
	if (t->at_us != INT64_MIN &&
	    due_key_below(at_us, seq, t->at_us, t->seq)) {
		t->at_us = at_us;
		t->seq = seq;
	}
	if (written_floor < t->written_floor)
		t->written_floor = written_floor;
	t->gen++;
}

bool store_due_turn_on(struct store_due_turn *t, uint64_t gen, int64_t at_us,
		       int64_t seq, uint64_t written_floor)
{
	pthread_mutex_lock(&t->lock);
	bool on = turn_on(t, gen, at_us, seq, written_floor);
	pthread_mutex_unlock(&t->lock);
	return on;
}

void store_due_turn_back(struct store_due_turn *t, int64_t at_us, int64_t seq,
			 uint64_t written_floor)
{
	pthread_mutex_lock(&t->lock);
	turn_back(t, at_us, seq, written_floor);
	pthread_mutex_unlock(&t->lock);
}

static struct store_due_turn *turn_of(const struct store *s)
{
	return s->opt.ordered ? NULL : s->opt.due_turn;
}

bool due_turn_begin(struct store *s, bool rescan, int64_t *at_us, int64_t *seq,
		    uint64_t *written_floor)
{
	struct store_due_turn *t = turn_of(s);
	if (!t)
		return false;
	if (s->due_turn_open)
		/* The previous lease ended with its session, without a
		 * word: its rows are free. */
		due_turn_ended(s, false);
	pthread_mutex_lock(&t->lock);
	s->due_turn_gen = t->gen;
	bool use = !rescan && t->at_us != INT64_MIN;
	s->due_turn_used = use;
	if (use) {
		*at_us = t->at_us;
		*seq = t->seq;
		*written_floor = t->written_floor;
	}
	pthread_mutex_unlock(&t->lock);
	return use;
}

void due_turn_taken(struct store *s, const struct due_taken *d)
{
	struct store_due_turn *t = turn_of(s);
	if (!t)
		return;
	s->due_turn_open = d->n > 0;
	s->due_turn_let_go = d->cut;
	s->due_turn_low_us = d->low_us;
	s->due_turn_low_seq = d->low_seq;
	/* Only a cut leaves late rows behind (the budget's, or a late row
	 * the batch had no room for); a release or a retry lets go rows it
	 * took, and the turn's key goes back to them. */
	s->due_turn_floor =
	    d->cut && d->written_floor_ok ? d->written_floor : UINT64_MAX;
	bool found = d->found_due && d->written_floor_ok;
	pthread_mutex_lock(&t->lock);
	if (d->rescan) {
		/* What a rescan says holds whatever the turn said before
		 * (a failover, a restore), unless a lease let rows go while
		 * it ran, which it stepped over as held: then no turn, and
		 * each store starts at its own batch until the next. */
		bool set = found && t->gen == s->due_turn_gen;
		t->at_us = set ? d->reach_us : INT64_MIN;
		t->seq = set ? d->reach_seq : INT64_MIN;
		t->written_floor = set ? d->written_floor : 0;
	} else if (found && s->due_turn_used) {
		/* A lease from its own floor (there was no turn as it
		 * began) says nothing of the rows between a turn set since
		 * and that floor. */
		turn_on(t, s->due_turn_gen, d->reach_us, d->reach_seq,
			d->written_floor);
	}
	pthread_mutex_unlock(&t->lock);
}

void due_turn_ended(struct store *s, bool committed)
{
	struct store_due_turn *t = turn_of(s);
	if (!t || !s->due_turn_open)
		return;
	s->due_turn_open = false;
	if (committed && !s->due_turn_let_go)
		return;
	store_due_turn_back(t, s->due_turn_low_us, s->due_turn_low_seq,
			    s->due_turn_floor);
}
