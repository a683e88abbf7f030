/* SPDX-License-Identifier: MIT */
/*
 * The sweeper: returns rows whose lease expired (their worker died or lost
 * its session) and, with partition ordering, repairs lost head markers.
 * One thread with its own store session; the sweep lock in the database
 * keeps replicas from sweeping at once.
 */
#include "loops_int.h"

#include <stdio.h>

#include "base/base.h"

#define SWEEP_CAP_ROWS 10000

/* Sweeps source i; -1 when shutdown began while reconnecting. */
static int sweep_source(struct relay_thread *th, struct source_stores *ss,
			size_t i)
{
	struct relay *r = th->relay;
	struct store *s = sources_store(th, ss, i);
	if (!s)
		return 0;
	char err[512];
	struct sweep_result sw;
	int64_t t0 = clock_ms();
	int rc = store_sweep(s, SWEEP_CAP_ROWS, &sw, err, sizeof(err));
	size_t repaired = 0;
	if (rc == 0 && r->cfg->ordering == ORDERING_PARTITION) {
		rc = store_repair_heads(s, &repaired, err, sizeof(err));
		if (rc == 0 && repaired > 0) {
			char keys[32];
			snprintf(keys, sizeof(keys), "%zu", repaired);
			log_fields(LOG_WARN,
				   "gave partition keys their lost head "
				   "marker",
				   "source", r->cfg->tables[i], "keys", keys,
				   NULL);
		}
	}
	metrics_observe(MH_SWEEP_SECONDS, (uint64_t)(clock_ms() - t0) * 1000);
	if (rc != 0)
		return sources_failed(th, ss, i, rc, "sweep", err);
	sources_ok(r, ss, i);
	if (sw.skipped)
		return 0;
	metrics_add(MC_SWEEPS, 1);
	metrics_add(MC_SWEPT_PENDING, sw.to_pending);
	metrics_add(MC_SWEPT_FAILED, sw.to_failed);
	metrics_set(MG_LAST_SWEEP_MS, clock_wall_us() / 1000);
	if (sw.to_pending + sw.to_failed > 0) {
		char p[32], f[32];
		snprintf(p, sizeof(p), "%zu", sw.to_pending);
		snprintf(f, sizeof(f), "%zu", sw.to_failed);
		log_fields(LOG_WARN, "swept expired leases", "source",
			   r->cfg->tables[i], "to_pending", p, "to_failed", f,
			   NULL);
		relay_wake(r);
	}
	return 0;
}

void *sweeper_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	struct source_stores ss;
	log_set_thread(th->name);
	bool open = sources_open(th, th->name, &ss);
	while (open && !relay_stopping(r)) {
		/* Every source in turn, each pass. */
		for (size_t i = 0; i < ss.n && !relay_stopping(r); i++) {
			loop_tick(th);
			if (sweep_source(th, &ss, i) != 0)
				break;
		}
		/* Only time (or shutdown) ends the sleep: relay_wake() is
		 * for workers, and with LISTEN on it comes with every
		 * inserting commit, which would make a sweep per commit. */
		relay_idle_since(th, NULL, r->cfg->sweep_interval_ms, NULL,
				 NULL);
	}
	sources_close(&ss);
	log_info("sweeper stopped");
	return NULL;
}
