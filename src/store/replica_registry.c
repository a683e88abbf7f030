/* SPDX-License-Identifier: MIT */
/*
 * The replica registry's writes: a relay's heartbeat (one table's, or
 * several tables' at once) and its leaving at a clean stop.
 */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_admin.h"
#include "store_internal.h"

/* The ordering a relay records (migration 014), read by redrive. */
static const char *ordering_of(const struct store *s)
{
	return s->opt.ordered ? "partition" : "none";
}

/* Text of a bigint parameter. */
static void ms_text(char *out, size_t outlen, int64_t ms)
{
	snprintf(out, outlen, "%lld", (long long)ms);
}

int store_admin_heartbeat(struct store *s, const char *id, const char *version,
			  struct store_kept kept, bool draining, bool starting,
			  char *err, size_t errlen)
{
	struct names n;
	admin_names_of(&s->table, &n);
	/* Pruning rides on the heartbeat: the table is tiny and the
	 * statement already writes to it. */
	char *sql = store_asprintf(
	    "WITH pruned AS (DELETE FROM %s WHERE last_seen_at < now() - "
	    "%d * interval '1 second' AND id <> $1) "
	    "INSERT INTO %s AS r (id, version, started_at, last_seen_at, "
	    "state, protocol, retention_ms, failed_retention_ms, ordering) "
	    "VALUES ($1, $2, now(), now(), $3, %d, $5::bigint, $6::bigint, "
	    "'%s') ON CONFLICT (id) DO UPDATE SET version = "
	    "excluded.version, last_seen_at = now(), state = excluded.state, "
	    "protocol = excluded.protocol, retention_ms = "
	    "excluded.retention_ms, failed_retention_ms = "
	    "excluded.failed_retention_ms, ordering = excluded.ordering, "
	    "started_at = "
	    "CASE WHEN $4::boolean THEN now() ELSE r.started_at END",
	    n.registry, STORE_ADMIN_PRUNE_AFTER_S, n.registry, STORE_PROTOCOL,
	    ordering_of(s));
	char sent[24], failed[24];
	ms_text(sent, sizeof(sent), kept.sent_ms);
	ms_text(failed, sizeof(failed), kept.failed_ms);
	const char *values[6] = {id,
				 version,
				 draining ? "draining" : "alive",
				 starting ? "true" : "false",
				 sent,
				 failed};
	int rc = store_exec_cmd(s, "registry heartbeat", sql, 6, values, NULL,
				err, errlen);
	free(sql);
	return rc;
}

int store_admin_forget(struct store *s, const char *id, char *err,
		       size_t errlen)
{
	struct names n;
	admin_names_of(&s->table, &n);
	char *sql = store_asprintf("DELETE FROM %s WHERE id = $1", n.registry);
	const char *values[1] = {id};
	int rc = store_exec_cmd(s, "registry delete", sql, 1, values, NULL, err,
				errlen);
	free(sql);
	return rc;
}

int store_admin_heartbeat_group(struct store *const *stores, size_t n,
				const char *id, const char *version,
				struct store_kept kept, bool draining,
				char *err, size_t errlen)
{
	int rc = STORE_ERROR;
	size_t cap = 1024 + n * 768, len = 0;
	if (n == 0)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (stores[i]->ses != stores[0]->ses) {
			snprintf(err, errlen,
				 "registry heartbeats: the stores do not share "
				 "a session");
			return STORE_ERROR;
		}
	/* The statement runs as the first store's, which checks its own
	 * table alone: each other one is checked as its own statement would
	 * be (after a reconnect: the table there, its version, its contract),
	 * so a table this relay now refuses is not beaten alive with the
	 * rest; the group fails, and the caller beats each alone. */
	for (size_t i = 1; i < n; i++) {
		int checked = store_check_session(stores[i], err, errlen);
		if (checked != 0)
			return checked;
	}
	char *sql = malloc(cap);
	if (!sql) {
		snprintf(err, errlen, "registry heartbeats: out of memory");
		return STORE_ERROR;
	}
	/* One statement, so one plan and one commit for the n tables. The
	 * prune and started_at's reset are left to store_admin_heartbeat()
	 * (a table's first heartbeat, then one in a hundred): in each of n
	 * CTEs they would grow every beat's plan. */
	for (size_t i = 0; i < n; i++) {
		/* The last one is the statement, the others its CTEs. */
		bool cte = i + 1 < n;
		char head[32] = "";
		if (cte)
			snprintf(head, sizeof(head), "%su%zu AS (",
				 i == 0 ? "WITH " : ", ", i);
		else if (n > 1)
			snprintf(head, sizeof(head), " ");
		struct names nm;
		admin_names_of(&stores[i]->table, &nm);
		len += (size_t)snprintf(
		    len < cap ? sql + len : NULL, len < cap ? cap - len : 0,
		    "%sINSERT INTO %s AS r (id, version, started_at, "
		    "last_seen_at, state, protocol, retention_ms, "
		    "failed_retention_ms, ordering) VALUES ($1, $2, now(), "
		    "now(), $3, %d, $4::bigint, $5::bigint, '%s') ON CONFLICT "
		    "(id) DO UPDATE SET version = excluded.version, "
		    "last_seen_at = now(), state = excluded.state, protocol = "
		    "excluded.protocol, retention_ms = excluded.retention_ms, "
		    "failed_retention_ms = excluded.failed_retention_ms, "
		    "ordering = excluded.ordering%s",
		    head, nm.registry, STORE_PROTOCOL, ordering_of(stores[i]),
		    cte ? ")" : "");
	}
	if (len >= cap) {
		snprintf(err, errlen,
			 "registry heartbeats: statement too long");
		goto out;
	}
	char sent[24], failed[24];
	ms_text(sent, sizeof(sent), kept.sent_ms);
	ms_text(failed, sizeof(failed), kept.failed_ms);
	const char *values[5] = {id, version, draining ? "draining" : "alive",
				 sent, failed};
	rc = store_exec_cmd(stores[0], "registry heartbeats", sql, 5, values,
			    NULL, err, errlen);
out:
	free(sql);
	return rc;
}
