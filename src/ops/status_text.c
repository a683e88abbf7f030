/* SPDX-License-Identifier: MIT */
/* `status` for people: the attention list and the text rendering. */
#include "status_text.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>

#include "store/store.h"

/* A snapshot older than this is named under ATTENTION. */
#define OLD_SNAPSHOT_S 300

static const cJSON *jget(const cJSON *obj, const char *key)
{
	return cJSON_GetObjectItemCaseSensitive(obj, key);
}

static double jnum(const cJSON *obj, const char *key)
{
	const cJSON *v = jget(obj, key);
	return cJSON_IsNumber(v) ? v->valuedouble : NAN;
}

static long long jint(const cJSON *obj, const char *key)
{
	double v = jnum(obj, key);
	return isnan(v) ? 0 : (long long)v;
}

static const char *jstr(const cJSON *obj, const char *key, const char *dflt)
{
	const cJSON *v = jget(obj, key);
	return cJSON_IsString(v) ? v->valuestring : dflt;
}

static bool jtrue(const cJSON *obj, const char *key)
{
	return cJSON_IsTrue(jget(obj, key));
}

/* 75 -> "1m15s", 7500 -> "2h05m"; NaN -> "-". */
static const char *span(double secs, char *out, size_t outlen)
{
	if (isnan(secs)) {
		snprintf(out, outlen, "-");
		return out;
	}
	long long s = (long long)llround(fabs(secs));
	if (s < 60)
		snprintf(out, outlen, "%llds", s);
	else if (s < 3600)
		snprintf(out, outlen, "%lldm%02llds", s / 60, s % 60);
	else if (s < 86400)
		snprintf(out, outlen, "%lldh%02lldm", s / 3600, s / 60 % 60);
	else
		snprintf(out, outlen, "%lldd%02lldh", s / 86400, s / 3600 % 24);
	return out;
}

/* text on one line (newlines and tabs become spaces), cut to max bytes
 * on a UTF-8 character boundary with "..." when longer. */
static const char *one_line(const char *text, char *out, size_t outlen,
			    size_t max)
{
	const char *src = text ? text : "";
	size_t len = strlen(src), n = len;
	bool cut = false;
	if (max >= outlen)
		max = outlen - 1;
	if (len > max) {
		n = max >= 3 ? max - 3 : 0;
		while (n > 0 && ((unsigned char)src[n] & 0xC0) == 0x80)
			n--;
		cut = true;
	}
	for (size_t i = 0; i < n; i++)
		out[i] = (src[i] == '\n' || src[i] == '\r' || src[i] == '\t')
			     ? ' '
			     : src[i];
	if (cut && max >= 3) {
		memcpy(out + n, "...", 3);
		n += 3;
	}
	out[n] = '\0';
	return out;
}

static void human_bytes(double b, char *out, size_t outlen)
{
	const char *units[] = {"B", "kB", "MB", "GB", "TB"};
	int u = 0;
	while (b >= 1024 && u < 4) {
		b /= 1024;
		u++;
	}
	snprintf(out, outlen, u ? "%.1f %s" : "%.0f %s", b, units[u]);
}

static void attend(cJSON *list, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Adds one line to the attention list (text and JSON alike). */
static void attend(cJSON *list, const char *fmt, ...)
{
	char line[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	cJSON_AddItemToArray(list, cJSON_CreateString(line));
}

static const char *plural(long long n)
{
	return n == 1 ? "" : "s";
}

cJSON *status_attention(const cJSON *st)
{
	cJSON *list = cJSON_CreateArray();
	if (!list)
		return NULL;
	long long dead = 0, orphaned = 0;
	bool paused_all = false;
	const cJSON *item;
	cJSON_ArrayForEach(item, jget(st, "replicas"))
	{
		if (!jtrue(item, "alive"))
			dead++;
	}
	cJSON_ArrayForEach(item, jget(st, "in_flight_holders"))
	{
		if (!jtrue(item, "holder_alive"))
			orphaned += jint(item, "rows");
	}
	cJSON_ArrayForEach(item, jget(st, "paused"))
	{
		if (strcmp(jstr(item, "destination", ""), "*") == 0)
			paused_all = true;
	}
	long long paused = cJSON_GetArraySize(jget(st, "paused"));
	long long expired = jint(jget(st, "in_flight"), "expired_leases");
	long long failed = jint(jget(st, "failed"), "count");
	long long blocked = jint(jget(st, "blocked_keys"), "count");
	long long live = cJSON_GetArraySize(jget(st, "replicas")) - dead;

	if (live == 0)
		attend(list, "no live replica: nothing is relaying");
	if (dead)
		attend(list, "%lld replica%s silent for more than %d s (DEAD)",
		       dead, plural(dead), STORE_ADMIN_DEAD_AFTER_S);
	if (orphaned)
		attend(list,
		       "%lld in-flight row%s held by replicas that are not "
		       "alive: the sweeper returns them once the lease expires",
		       orphaned, plural(orphaned));
	if (expired)
		attend(list,
		       "%lld expired lease%s not yet swept (is any sweeper "
		       "running?)",
		       expired, plural(expired));
	if (failed)
		attend(list,
		       "%lld failed row%s: see FAILED; fix the cause, then "
		       "`outbox-relay redrive`",
		       failed, plural(failed));
	if (paused_all)
		attend(list, "all leasing is PAUSED: `outbox-relay resume` "
			     "lifts it");
	if (paused - (paused_all ? 1 : 0) > 0)
		attend(list, "%lld destination%s paused by an operator",
		       paused - (paused_all ? 1 : 0),
		       plural(paused - (paused_all ? 1 : 0)));
	if (blocked)
		attend(list,
		       "%lld partition key%s blocked by a failed row: see "
		       "BLOCKED KEYS",
		       blocked, plural(blocked));
	cJSON_ArrayForEach(item, jget(st, "oldest_xmin_holders"))
	{
		char age[32], who[200];
		double secs = jnum(item, "xact_age_seconds");
		/* A slot keeps no time: one nothing reads (its standby or
		 * consumer gone) holds the horizon until it is dropped. */
		if (strcmp(jstr(item, "kind", ""), "replication slot") == 0 &&
		    strcmp(jstr(item, "state", ""), "inactive") == 0 &&
		    !isnan(jnum(item, "xmin_age"))) {
			attend(
			    list,
			    "replication slot '%s' is inactive and holds the "
			    "xmin horizon %lld transactions back: vacuum "
			    "cannot remove dead rows behind it; drop it "
			    "(pg_drop_replication_slot) if nothing will read "
			    "it again",
			    jstr(item, "name", "?"), jint(item, "xmin_age"));
			continue;
		}
		if (isnan(secs) || secs < OLD_SNAPSHOT_S)
			continue;
		if (strcmp(jstr(item, "kind", ""), "session") == 0)
			snprintf(who, sizeof(who), "session pid %lld (%s)",
				 jint(item, "pid"), jstr(item, "name", ""));
		else
			snprintf(who, sizeof(who), "%s '%s'",
				 jstr(item, "kind", "?"),
				 jstr(item, "name", "?"));
		attend(list,
		       "%s has held a snapshot for %s: vacuum cannot remove "
		       "dead rows behind it (see OLDEST SNAPSHOTS)",
		       who, span(secs, age, sizeof(age)));
	}
	return list;
}

static void print_replicas(const cJSON *st, FILE *out)
{
	const cJSON *rows = jget(st, "replicas"), *r;
	int alive = 0, dead = 0;
	char up[32], seen[32];
	cJSON_ArrayForEach(r, rows)
	{
		if (jtrue(r, "alive"))
			alive++;
		else
			dead++;
	}
	fprintf(out, "\nREPLICAS  %d alive, %d dead\n", alive, dead);
	if (alive + dead == 0) {
		fprintf(out,
			"  (none registered: no relay has run against this "
			"table recently)\n");
		return;
	}
	fprintf(out, "  %-9s %-32s %-10s %-8s %-9s %-9s %s\n", "STATUS", "ID",
		"VERSION", "PROTOCOL", "RETENTION", "UP", "LAST SEEN");
	cJSON_ArrayForEach(r, rows)
	{
		const char *state =
		    !jtrue(r, "alive")				    ? "DEAD"
		    : strcmp(jstr(r, "state", ""), "draining") == 0 ? "draining"
								    : "alive";
		/* None: a relay older than the registry's protocol column,
		 * which contract steps wait for (design.md §11). */
		char proto[16] = "none";
		const cJSON *p =
		    cJSON_GetObjectItemCaseSensitive(r, "protocol");
		if (cJSON_IsNumber(p))
			snprintf(proto, sizeof(proto), "%d", p->valueint);
		/* How long it keeps sent rows: "?" for a relay older than
		 * the column, "none" for no history. */
		char kept[16] = "?";
		const cJSON *k =
		    cJSON_GetObjectItemCaseSensitive(r, "retention_ms");
		if (cJSON_IsNumber(k) && k->valuedouble <= 0)
			snprintf(kept, sizeof(kept), "none");
		else if (cJSON_IsNumber(k))
			span(k->valuedouble / 1000, kept, sizeof(kept));
		fprintf(
		    out, "  %-9s %-32s %-10s %-8s %-9s %-9s %s ago\n", state,
		    jstr(r, "id", "?"), jstr(r, "version", "?"), proto, kept,
		    span(jnum(r, "up_seconds"), up, sizeof(up)),
		    span(jnum(r, "last_seen_seconds_ago"), seen, sizeof(seen)));
	}
}

static void print_backlog(const cJSON *st, FILE *out)
{
	const cJSON *b = jget(st, "backlog");
	char age[32];
	fprintf(out, "\nBACKLOG\n");
	fprintf(
	    out, "  pending         %lld (due now %lld, crash suspects %lld)\n",
	    jint(b, "pending"), jint(b, "due_now"), jint(b, "crash_suspects"));
	if (jint(b, "pending") > 0)
		fprintf(out, "  oldest pending  %s (created %s)\n",
			span(jnum(b, "oldest_pending_age_seconds"), age,
			     sizeof(age)),
			jstr(b, "oldest_pending_created_at", "?"));
	else
		fprintf(out, "  oldest pending  -\n");
}

/* "in 42s" or "expired 5s ago". */
static const char *expiry(double secs, char *out, size_t outlen)
{
	char s[32];
	span(secs, s, sizeof(s));
	if (isnan(secs))
		snprintf(out, outlen, "-");
	else if (secs < 0)
		snprintf(out, outlen, "EXPIRED %s ago", s);
	else
		snprintf(out, outlen, "in %s", s);
	return out;
}

static void print_in_flight(const cJSON *st, FILE *out)
{
	const cJSON *f = jget(st, "in_flight"), *r;
	char when[48];
	long long count = jint(f, "count");
	fprintf(out, "\nIN FLIGHT  %lld row%s, %lld expired lease%s\n", count,
		count == 1 ? "" : "s", jint(f, "expired_leases"),
		jint(f, "expired_leases") == 1 ? "" : "s");
	if (count == 0)
		return;
	fprintf(out, "  by holder:\n  %-32s %-6s %-7s %-8s %s\n", "HOLDER",
		"ALIVE", "ROWS", "EXPIRED", "NEXT EXPIRY");
	cJSON_ArrayForEach(r, jget(st, "in_flight_holders"))
	{
		fprintf(out, "  %-32s %-6s %-7lld %-8lld %s\n",
			jstr(r, "holder", "(unknown)"),
			jtrue(r, "holder_alive") ? "yes" : "NO",
			jint(r, "rows"), jint(r, "expired"),
			expiry(jnum(r, "next_expiry_in_seconds"), when,
			       sizeof(when)));
	}
	const cJSON *rows = jget(st, "in_flight_rows");
	fprintf(out, "  rows (soonest expiry first%s):\n",
		cJSON_GetArraySize(rows) < count ? ", cut" : "");
	fprintf(out, "  %-36s %-24s %-34s %-6s %-8s %s\n", "ID", "TYPE",
		"LEASED BY", "ALIVE", "ATTEMPT", "LEASE");
	cJSON_ArrayForEach(r, rows)
	{
		char type[32], by[40], att[24];
		snprintf(att, sizeof(att), "%lld/%lld", jint(r, "attempts"),
			 jint(r, "max_attempts"));
		fprintf(out, "  %-36s %-24s %-34s %-6s %-8s %s\n",
			jstr(r, "id", "?"),
			one_line(jstr(r, "type", ""), type, sizeof(type), 24),
			one_line(jstr(r, "leased_by", "(none)"), by, sizeof(by),
				 34),
			jtrue(r, "holder_alive") ? "yes" : "NO", att,
			expiry(jnum(r, "lease_expires_in_seconds"), when,
			       sizeof(when)));
	}
}

static void print_failed(const cJSON *st, FILE *out)
{
	const cJSON *r;
	char type[40], sample[128];
	long long count = jint(jget(st, "failed"), "count");
	fprintf(out, "\nFAILED  %lld row%s\n", count, count == 1 ? "" : "s");
	if (count == 0)
		return;
	fprintf(out, "  %-8s %-32s %-21s %s\n", "COUNT", "TYPE", "LAST FAILED",
		"SAMPLE ERROR (latest)");
	cJSON_ArrayForEach(r, jget(st, "failed_by_type"))
	{
		fprintf(out, "  %-8lld %-32s %-21s %s\n", jint(r, "count"),
			one_line(jstr(r, "type", ""), type, sizeof(type), 32),
			jstr(r, "last_failed_at", "?"),
			one_line(jstr(r, "sample_error", "(no error text)"),
				 sample, sizeof(sample), 100));
	}
}

static void print_paused(const cJSON *st, FILE *out)
{
	const cJSON *r, *rows = jget(st, "paused");
	char ago[32], reason[128];
	fprintf(out, "\nPAUSED\n");
	if (cJSON_GetArraySize(rows) == 0) {
		fprintf(out, "  (none)\n");
		return;
	}
	cJSON_ArrayForEach(r, rows)
	{
		const char *d = jstr(r, "destination", "?");
		bool all = strcmp(d, "*") == 0;
		fprintf(out, "  %s%s%s  for %s, by %s: %s\n",
			all ? "" : "destination '", all ? "ALL LEASING" : d,
			all ? "" : "'",
			span(jnum(r, "paused_seconds"), ago, sizeof(ago)),
			jstr(r, "paused_by", "?"),
			one_line(jstr(r, "reason", "(no reason given)"), reason,
				 sizeof(reason), 100));
	}
}

static void print_blocked(const cJSON *st, FILE *out)
{
	const cJSON *b = jget(st, "blocked_keys"), *r;
	char row[160], reason[128], key[80];
	fprintf(out, "\nBLOCKED KEYS\n");
	if (!jtrue(b, "present")) {
		fprintf(out, "  (none: the table predates ordered delivery; "
			     "`outbox-relay migrate` adds it)\n");
		return;
	}
	if (jint(b, "count") == 0) {
		fprintf(out, "  (none)\n");
		return;
	}
	fprintf(out,
		"  %lld key%s held back by a failed row (ordered mode, "
		"on_failure=block)\n",
		jint(b, "count"), plural(jint(b, "count")));
	cJSON_ArrayForEach(r, jget(b, "rows"))
	{
		const cJSON *k = jget(r, "key");
		const char *pk = jstr(k, "partition_key", NULL);
		if (pk) {
			fprintf(out,
				"  key '%s' blocked by row %s since %s: %s\n",
				one_line(pk, key, sizeof(key), 60),
				jstr(k, "blocking_id", "?"),
				jstr(k, "blocked_at", "?"),
				one_line(jstr(k, "reason", "(no reason)"),
					 reason, sizeof(reason), 100));
			continue;
		}
		/* Columns of a later schema: shown as they are. */
		char *text = cJSON_PrintUnformatted(k);
		fprintf(out, "  %s\n", one_line(text, row, sizeof(row), 150));
		cJSON_free(text);
	}
}

static void print_table(const cJSON *st, FILE *out)
{
	const cJSON *t = jget(st, "table_stats");
	char size[32], ago[32];
	human_bytes(jnum(t, "total_bytes"), size, sizeof(size));
	fprintf(out, "\nTABLE\n");
	fprintf(out,
		"  live tuples %lld, dead tuples %lld, size %s (with "
		"indexes)\n",
		jint(t, "live_tuples"), jint(t, "dead_tuples"), size);
	double since = jnum(t, "vacuumed_seconds_ago");
	if (isnan(since))
		fprintf(out, "  vacuumed: never since statistics were reset\n");
	else
		fprintf(out,
			"  vacuumed %s ago (last vacuum %s, last autovacuum "
			"%s)\n",
			span(since, ago, sizeof(ago)),
			jstr(t, "last_vacuum", "never"),
			jstr(t, "last_autovacuum", "never"));
	fprintf(out, "  analyzed: last analyze %s, last autoanalyze %s\n",
		jstr(t, "last_analyze", "never"),
		jstr(t, "last_autoanalyze", "never"));
}

static void print_horizon(const cJSON *st, FILE *out)
{
	const cJSON *r, *rows = jget(st, "oldest_xmin_holders");
	char age[32], query[160];
	fprintf(out, "\nOLDEST SNAPSHOTS (dead rows newer than these cannot be "
		     "vacuumed)\n");
	if (cJSON_GetArraySize(rows) == 0) {
		fprintf(out, "  (none)\n");
		return;
	}
	cJSON_ArrayForEach(r, rows)
	{
		const char *kind = jstr(r, "kind", "?");
		if (strcmp(kind, "session") == 0) {
			fprintf(
			    out,
			    "  pid %lld, %s, user %s, %s, transaction open "
			    "%s, xmin age %lld\n",
			    jint(r, "pid"),
			    *jstr(r, "name", "") ? jstr(r, "name", "")
						 : jstr(r, "backend_type", "?"),
			    jstr(r, "user_name", "?"), jstr(r, "state", "?"),
			    span(jnum(r, "xact_age_seconds"), age, sizeof(age)),
			    jint(r, "xmin_age"));
			fprintf(out, "      query: %s\n",
				one_line(jstr(r, "query", ""), query,
					 sizeof(query), 150));
		} else if (!isnan(jnum(r, "catalog_xmin_age"))) {
			/* A logical slot: its catalog_xmin holds back only
			 * the catalogs, not the outbox. */
			fprintf(out,
				"  %s %s (%s), xmin age %lld, catalog xmin "
				"age %lld (catalogs only)\n",
				kind, jstr(r, "name", "?"),
				jstr(r, "state", "?"), jint(r, "xmin_age"),
				jint(r, "catalog_xmin_age"));
		} else {
			fprintf(out, "  %s %s (%s), xmin age %lld\n", kind,
				jstr(r, "name", "?"), jstr(r, "state", "?"),
				jint(r, "xmin_age"));
		}
	}
}

void status_print(const cJSON *st, FILE *out)
{
	const cJSON *db = jget(st, "database"), *a;
	fprintf(out,
		"outbox-relay status: table %s, database %s (PostgreSQL %s), "
		"at %s\n",
		jstr(st, "table", "?"), jstr(db, "database", "?"),
		jstr(db, "server_version", "?"), jstr(db, "checked_at", "?"));
	const cJSON *list = jget(st, "attention");
	if (cJSON_GetArraySize(list) == 0) {
		fprintf(out, "\nall clear: nothing needs attention\n");
	} else {
		fprintf(out, "\nATTENTION\n");
		cJSON_ArrayForEach(a, list)
		    fprintf(out, "  ! %s\n", a->valuestring);
	}
	print_replicas(st, out);
	print_backlog(st, out);
	print_in_flight(st, out);
	print_failed(st, out);
	print_paused(st, out);
	print_blocked(st, out);
	print_table(st, out);
	print_horizon(st, out);
}
