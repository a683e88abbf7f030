/* SPDX-License-Identifier: MIT */
/*
 * The cleaner: deletes sent and failed rows past their retention, in
 * capped rounds so one pass never holds the table for long. One thread
 * with its own store session.
 */
#include "loops_int.h"

#include "base/base.h"

#define CLEAN_CAP_BATCHES 20
#define CLEAN_PAUSE_MS 100

/* Days of partitions made ahead: past the next round with half a day to
 * spare, so that at least one more round (at most 12 h later) may try
 * again if one finds its locks taken. Every partition costs every lease
 * and mark (a generic plan locks them all), so no more: with rounds of
 * up to 12 h, tomorrow's alone (docs/benchmark.md, "A held snapshot on
 * the partitioned table", the steady rate). */
static int days_ahead(const struct config *cfg)
{
	const long long day_ms = 24 * 3600 * 1000LL;
	return (int)((cfg->clean_interval_ms + day_ms / 2) / day_ms) + 1;
}

/* A table made partitioned by `migrate --partition`: its daily
 * partitions made ahead and dropped past retention
 * (store_partitions_tend()). Before the row deletes, which then spare the
 * daily partitions' rows.
 * A failure is logged and leaves the rows to the default partition and
 * the deletes: nothing is lost by it, only what partitions save. */
static void tend_partitions(struct relay *r, struct store *s, size_t i)
{
	const struct config *cfg = r->cfg;
	char err[512];
	struct partition_result pr;
	/* A failed step may follow others done: they are counted too. */
	if (store_partitions_tend(s, days_ahead(cfg), cfg->retention_ms,
				  cfg->failed_retention_ms, &pr, err,
				  sizeof(err)) != 0)
		log_fields(LOG_WARN, "partitions not tended", "source",
			   relay_source_name(r, i), "error", err, NULL);
	if (pr.created + pr.dropped + pr.kept > 0) {
		char made[24], dropped[24], carried[24], kept[24];
		snprintf(made, sizeof(made), "%zu", pr.created);
		snprintf(dropped, sizeof(dropped), "%zu", pr.dropped);
		snprintf(carried, sizeof(carried), "%zu", pr.carried);
		snprintf(kept, sizeof(kept), "%zu", pr.kept);
		log_fields(LOG_INFO, "partitions made and dropped", "source",
			   relay_source_name(r, i), "made", made, "dropped",
			   dropped, "carried", carried, "kept", kept, NULL);
	}
	metrics_add(MC_PARTITIONS_MADE, pr.created);
	metrics_add(MC_PARTITIONS_DROPPED, pr.dropped);
}

/* Cleans source i; the time until its next round, or -1 when shutdown
 * began while reconnecting. Partitions are tended once a clean interval
 * (and first with each store, which knows nothing of its table's shape
 * until then), not at the second's follow-ups of a capped round: in a
 * backlog (the default partition's history after `migrate --partition`)
 * with a day to drop whose locks are contended, each try queued every
 * insert, lease and mark behind its ACCESS EXCLUSIVE request for up to
 * its lock wait, every second. */
static int64_t clean_source(struct relay_thread *th, struct source_stores *ss,
			    size_t i)
{
	struct relay *r = th->relay;
	const struct config *cfg = r->cfg;
	size_t cap = (size_t)cfg->clean_batch_size * CLEAN_CAP_BATCHES;
	int64_t next = cfg->clean_interval_ms;
	struct store *s = sources_store(th, ss, i);
	if (!s)
		return next;
	char err[512];
	int64_t now = clock_ms();
	int64_t *tended = &ss->at[i].tended_ms;
	if (*tended == 0 || now >= *tended + cfg->clean_interval_ms) {
		tend_partitions(r, s, i);
		*tended = now > 0 ? now : 1;
	}
	struct clean_result cr;
	int rc = store_clean(s, cfg->retention_ms, cfg->failed_retention_ms,
			     cap, CLEAN_PAUSE_MS, &cr, err, sizeof(err));
	if (rc != 0)
		return sources_failed(th, ss, i, rc, "clean", err) != 0 ? -1
									: next;
	sources_ok(r, ss, i);
	if (cr.skipped)
		return next;
	metrics_add(MC_CLEANS, 1);
	metrics_add(MC_CLEANED_SENT, cr.sent_deleted);
	metrics_add(MC_CLEANED_FAILED, cr.failed_deleted);
	metrics_set(MG_LAST_CLEAN_MS, clock_wall_us() / 1000);
	if (cr.sent_deleted + cr.failed_deleted > 0)
		source_log_counts(LOG_INFO, "cleaned sent and failed rows", r,
				  i, "sent", cr.sent_deleted, "failed",
				  cr.failed_deleted);
	/* Hit the cap: more is due; go on after a pause. */
	return cr.sent_deleted + cr.failed_deleted >= cap ? 1000 : next;
}

void *cleaner_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	struct source_stores ss = {0};
	log_set_thread(th->name);
	bool open = sources_open(th, th->name, &ss);
	while (open && !relay_stopping(r)) {
		/* Every source in turn; the soonest any wants next. */
		int64_t next = r->cfg->clean_interval_ms;
		size_t n = relay_sources_n(r);
		for (size_t i = 0; i < n && !relay_stopping(r); i++) {
			loop_tick(th);
			int64_t want = clean_source(th, &ss, i);
			if (want < 0)
				break;
			if (want < next)
				next = want;
		}
		/* Not woken by relay_wake(): see the sweeper. Rounds may be
		 * an hour apart: a source gone meanwhile is let go each
		 * second, not kept counted failing until the next. */
		int64_t until = clock_ms() + next;
		for (int64_t left = next; left > 0 && !relay_stopping(r);
		     left = until - clock_ms()) {
			relay_idle_since(th, NULL, left < 1000 ? left : 1000,
					 NULL, NULL);
			sources_let_go_gone(r, &ss);
		}
	}
	sources_close(r, &ss);
	log_info("cleaner stopped");
	return NULL;
}
