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

void *cleaner_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	const struct config *cfg = r->cfg;
	log_set_thread(th->name);
	struct store *s = relay_open_store(th, th->name);
	size_t cap = (size_t)cfg->clean_batch_size * CLEAN_CAP_BATCHES;
	while (s && !relay_stopping(r)) {
		loop_tick(th);
		char err[512];
		struct clean_result cr;
		int rc =
		    store_clean(s, cfg->retention_ms, cfg->failed_retention_ms,
				cap, CLEAN_PAUSE_MS, &cr, err, sizeof(err));
		int64_t next = cfg->clean_interval_ms;
		if (rc != 0) {
			log_warn("clean failed: %s", err);
			if (rc == STORE_RECONNECT &&
			    relay_reconnect(th, s) != 0)
				break;
		} else if (!cr.skipped) {
			metrics_add(MC_CLEANS, 1);
			metrics_add(MC_CLEANED_SENT, cr.sent_deleted);
			metrics_add(MC_CLEANED_FAILED, cr.failed_deleted);
			metrics_set(MG_LAST_CLEAN_MS, clock_wall_us() / 1000);
			if (cr.sent_deleted + cr.failed_deleted > 0)
				log_info("cleaned %zu sent and %zu failed rows",
					 cr.sent_deleted, cr.failed_deleted);
			/* Hit the cap: more is due; go on after a pause. */
			if (cr.sent_deleted + cr.failed_deleted >= cap)
				next = 1000;
		}
		/* Not woken by relay_wake(): see the sweeper. */
		relay_idle_since(th, NULL, next, NULL, NULL);
	}
	store_close(s);
	log_info("cleaner stopped");
	return NULL;
}
