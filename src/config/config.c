/* SPDX-License-Identifier: MIT */
/*
 * Settings from the environment. The core table (config_core_rows below)
 * and the groups the extensions bring drive parsing, defaults,
 * validation, --help, the README table and config_knows(); a group's
 * prefix variables and the cross-checks of docs/design.md §4
 * follow them.
 */
#include "config.h"
#include "settings.h"

#include "base/base.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#define SECOND SETTING_SECOND
#define MINUTE SETTING_MINUTE
#define HOUR SETTING_HOUR
#define DAY SETTING_DAY
#define C struct config

/* SET_ENUM rows store the index of the choice: keep the orders equal. */
_Static_assert(CE_MODE_BINARY == 0 && CE_MODE_STRUCTURED == 1, "choices");
_Static_assert(ORDERING_NONE == 0 && ORDERING_PARTITION == 1, "choices");
_Static_assert(ON_FAILURE_SKIP == 0 && ON_FAILURE_BLOCK == 1, "choices");
_Static_assert(LOG_FORMAT_JSON == 0 && LOG_FORMAT_TEXT == 1, "choices");
/* OUTBOX_TABLE's help text states the limit. */
_Static_assert(TABLE_NAME_MAX == 43, "OUTBOX_TABLE help");

static const char *const ce_mode_choices[] = {"binary", "structured", NULL};
static const char *const ordering_choices[] = {"none", "partition", NULL};
static const char *const on_failure_choices[] = {"skip", "block", NULL};
static const char *const log_level_choices[] = {"debug", "info", "warn",
						"error", NULL};
static const char *const log_format_choices[] = {"json", "text", NULL};
static const char *const pg_prepare_choices[] = {"on", "off", "pooled", NULL};

/* OUTBOX_PG_PREPARE was a boolean: true and false still say on and off. */
static int pg_prepare_lookup(const char *v)
{
	if (strcmp(v, "true") == 0)
		return PG_PREPARE_ON;
	if (strcmp(v, "false") == 0)
		return PG_PREPARE_OFF;
	for (int i = 0; pg_prepare_choices[i]; i++)
		if (strcmp(v, pg_prepare_choices[i]) == 0)
			return i;
	return -1;
}

static int check_table(const char *v, char *why, size_t whylen);
static int check_ce_source(const char *v, char *why, size_t whylen);
static int check_http_addr(const char *v, char *why, size_t whylen);

/* OUTBOX_TABLE's help states base's limit in words. */
_Static_assert(TABLE_NAME_MAX == 43, "update OUTBOX_TABLE's help text");

const struct setting config_core_rows[] = {
    /* Postgres */
    SETTING_STRING(
	C, "OUTBOX_DATABASE_URL", database_url, NULL, NULL,
	SETTING_SECRET | SETTING_NULLABLE,
	"Postgres connection URI or key=value string; unset or empty "
	"uses libpq's PG* variables"),
    SETTING_STRING(
	C, "OUTBOX_DATABASES", databases_list, NULL, config_check_databases,
	SETTING_NULLABLE,
	"several databases, by name, comma-separated (at most 64; a name is "
	"lower-case letters, digits and _, not file nor ending in _file): "
	"each has its URL in "
	"OUTBOX_DATABASE_URL_<NAME> (or _FILE) and may have a LISTEN URL in "
	"OUTBOX_LISTEN_DATABASE_URL_<NAME>; OUTBOX_TABLE is relayed in each. "
	"Unset: one database, OUTBOX_DATABASE_URL"),
    SETTING_STRING(
	C, "OUTBOX_TABLE", table, "outbox_events", check_table, 0,
	"outbox table, name or schema.name; each part an SQL "
	"identifier of at most 43 bytes, taken as written (upper "
	"case as if quoted: a warning says so); several tables of the "
	"database, comma-separated, are each relayed on the same "
	"sessions (at most 1000); a schema with * (tenant_*.outbox_"
	"events) is a pattern: every matching table, looked up "
	"again each OUTBOX_DISCOVERY_INTERVAL"),
    SETTING_DURATION(C, "OUTBOX_DISCOVERY_INTERVAL", discovery_interval_ms,
		     "30s", SECOND, HOUR, 0,
		     "how often the patterns of OUTBOX_TABLE are looked up "
		     "again: a new matching table is relayed, a dropped one "
		     "let go"),
    SETTING_BOOL(C, "OUTBOX_LISTEN", listen, "off",
		 "wake workers by LISTEN/NOTIFY (needs the NOTIFY trigger from "
		 "sql/) besides polling"),
    SETTING_STRING(
	C, "OUTBOX_LISTEN_DATABASE_URL", listen_database_url, NULL, NULL,
	SETTING_SECRET | SETTING_NULLABLE,
	"direct (never pooled) connection for LISTEN; unset or empty "
	"uses OUTBOX_DATABASE_URL"),
    SETTING_ENUM(C, "OUTBOX_PG_PREPARE", pg_prepare, "on", pg_prepare_choices,
		 pg_prepare_lookup,
		 "named prepared statements, each prepared once a session "
		 "(on); none (off); or, behind a transaction-mode pooler, "
		 "each prepared once a server connection and found there "
		 "again (pooled; a relay left on behind one turns to it "
		 "itself, with an error); true and false say on and off"),
    SETTING_DURATION(
	C, "OUTBOX_STATEMENT_TIMEOUT", statement_timeout_ms, "10s", 100, HOUR,
	0,
	"Postgres statement_timeout, also the budget for writing a "
	"batch's outcomes"),
    SETTING_DURATION(
	C, "OUTBOX_PG_DEAD_PEER_TIMEOUT", pg_dead_peer_ms, "15s", 2 * SECOND,
	10 * MINUTE, 0,
	"how soon a Postgres peer that stopped answering (a cut link, a "
	"half-open connection) is given up, on both ends: the relay's TCP "
	"keepalives, tcp_user_timeout and connect timeout, and the "
	"server's keepalives for the relay's lease transactions; at most "
	"half the lease timeout is used"),

    /* Publisher */
    SETTING_STRING(C, "OUTBOX_PUBLISHER", publisher, "stdout", NULL, 0,
		   "publisher backend"),

    /* CloudEvents */
    SETTING_STRING(C, "OUTBOX_CE_SOURCE", ce_source, "/outbox-relay",
		   check_ce_source, 0,
		   "CloudEvents source for rows whose source is NULL; a "
		   "URI-reference (RFC 3986)"),
    SETTING_ENUM(C, "OUTBOX_CE_MODE", ce_mode, "binary", ce_mode_choices, NULL,
		 "CloudEvents content mode"),

    /* Loops */
    SETTING_INT(C, "OUTBOX_BATCH_SIZE", batch_size, "100", 1, 10000,
		"rows leased per batch"),
    SETTING_SIZE(C, "OUTBOX_BATCH_BYTES", batch_bytes, "32MiB",
		 64 * SETTING_KIB, SETTING_GIB,
		 "payload bytes a batch stops adding rows at (the first row "
		 "always goes): bounds a worker's memory"),
    SETTING_INT(C, "OUTBOX_WORKERS", workers, "1", 1, 64,
		"relay worker threads per process"),
    SETTING_INT(C, "OUTBOX_WORKER_WINDOW", worker_window, "0", 0, 8,
		"lanes per worker, each with one batch in flight: while one "
		"lane's batch is with the broker the next lane leases and "
		"the last marks (each lane its own Postgres session); 1 "
		"leases, publishes and marks in turn; 0: 2 lanes for a "
		"single worker, 1 with several"),
    SETTING_DURATION(C, "OUTBOX_POLL_INTERVAL", poll_interval_ms, "2s", 10,
		     HOUR, 0, "longest idle sleep between polls"),
    SETTING_DURATION(C, "OUTBOX_LEASE_INTERVAL", lease_interval_ms, "14ms", 1,
		     SECOND, 0,
		     "after a partial batch, the time from one lease's start "
		     "to the worker's next: shorter cuts latency and costs "
		     "Postgres more lease statements per event"),
    SETTING_DURATION(C, "OUTBOX_LEASE_RESCAN_INTERVAL", lease_rescan_ms, "5s",
		     SECOND, HOUR, SETTING_ZERO_OK,
		     "a worker's lease starts its scan at its previous batch's "
		     "oldest row and finds rows committed late by their "
		     "writers' transaction ids; one lease of the process "
		     "scans from the start this often (longer when a scan is "
		     "slow), and in ordered mode each session walks every "
		     "key anew this often to rebuild its key map: a row "
		     "written before migration 007, let go by a relay that "
		     "stopped or made pending by hand waits at most about "
		     "this long; 0 scans and walks from the start every time"),
    SETTING_DURATION(C, "OUTBOX_PUBLISH_TIMEOUT", publish_timeout_ms, "5s", 100,
		     HOUR, 0, "deadline for the broker to acknowledge a batch"),
    SETTING_DURATION(C, "OUTBOX_LEASE_TIMEOUT", lease_timeout_ms, "1m", SECOND,
		     DAY, 0,
		     "how long a leased row belongs to its relay; must exceed "
		     "publish timeout plus statement timeout"),
    SETTING_DURATION(C, "OUTBOX_SWEEP_INTERVAL", sweep_interval_ms, "30s", 100,
		     HOUR, 0,
		     "how often expired leases are returned, and within about "
		     "a second of any of the relay's sessions being connected "
		     "again; must be below the lease timeout"),
    SETTING_DURATION(C, "OUTBOX_CLEAN_INTERVAL", clean_interval_ms, "1h",
		     SECOND, DAY, 0,
		     "how often old sent and failed rows are deleted"),
    SETTING_INT(C, "OUTBOX_CLEAN_BATCH_SIZE", clean_batch_size, "1000", 1,
		100000, "rows deleted per cleaner transaction"),
    SETTING_DURATION(C, "OUTBOX_RETENTION", retention_ms, "24h", MINUTE,
		     3650 * DAY, SETTING_ZERO_OK,
		     "how long sent rows are kept; 0 deletes a row as soon as "
		     "the broker acknowledged it (no history)"),
    SETTING_DURATION(C, "OUTBOX_FAILED_RETENTION", failed_retention_ms, "7d",
		     MINUTE, 3650 * DAY, SETTING_ZERO_OK,
		     "how long failed rows are kept; 0 keeps them"),
    SETTING_DURATION(C, "OUTBOX_BACKOFF_BASE", backoff_base_ms, "2s", 100, DAY,
		     0, "retry delay after a row's first failed attempt"),
    SETTING_DURATION(C, "OUTBOX_BACKOFF_MAX", backoff_max_ms, "5m", 100,
		     7 * DAY, 0, "longest retry delay"),
    SETTING_DOUBLE(C, "OUTBOX_BACKOFF_FACTOR", backoff_factor, "2", 1, 10,
		   "growth of the retry delay per attempt"),
    SETTING_ENUM(C, "OUTBOX_ORDERING", ordering, "none", ordering_choices, NULL,
		 "partition delivers rows of one partition_key in seq order"),
    SETTING_ENUM(
	C, "OUTBOX_ORDERING_ON_FAILURE", on_failure, "skip", on_failure_choices,
	NULL,
	"in partition ordering, whether a failed row lets its key go on "
	"(skip) or blocks it until resolved (block)"),
    SETTING_DOUBLE(C, "OUTBOX_MAX_RATE", max_rate, "0", 0, 1000000,
		   "events per second per process, 0 = unlimited"),
    SETTING_SIZE(C, "OUTBOX_MAX_EVENT_SIZE", max_event_size, "16MiB",
		 SETTING_KIB, SETTING_GIB,
		 "largest event relayed (payload, headers and the row's "
		 "attributes); a larger row fails at once with the reason, "
		 "before anything is sent or parsed"),
    SETTING_DURATION(
	C, "OUTBOX_SHUTDOWN_TIMEOUT", shutdown_timeout_ms, "25s", SECOND, HOUR,
	0,
	"graceful shutdown budget; must exceed the publish timeout plus "
	"the statement timeout"),

    /* Operations */
    SETTING_STRING(
	C, "OUTBOX_HTTP_ADDR", http_addr, "0.0.0.0:9090", check_http_addr, 0,
	"host:port for /healthz, /readyz and /metrics ([::] for IPv6); "
	"empty disables HTTP"),
    SETTING_INT(C, "OUTBOX_METRICS_SOURCES", metrics_sources, "100", 0,
		RELAY_METRICS_SOURCES_MAX,
		"how many sources have /metrics series of their "
		"own (source label), the first in the source list; the rest "
		"are summed under source=\"(other)\"; 0: none"),
    SETTING_ENUM(C, "OUTBOX_LOG_LEVEL", log_level, "info", log_level_choices,
		 log_level_parse, "lowest level logged"),
    SETTING_ENUM(C, "OUTBOX_LOG_FORMAT", log_format, "json", log_format_choices,
		 NULL, "log line format"),
};

const size_t config_core_n_rows = ARRAY_SIZE(config_core_rows);

/* The one rule for the table's name is base's, which the store uses. */
/*
 * OUTBOX_TABLE: one table, or several separated by commas (docs/design.md
 * §13), each a name or schema.name. Splits v into *out (malloc'd strings,
 * *n of them) when out is not NULL; checks only when it is.
 */
static int split_tables(const char *v, char ***out, size_t *n, char *why,
			size_t whylen)
{
	char **names = NULL;
	size_t count = 0;
	int rc = -1;
	for (const char *next = v; next;) {
		const char *p;
		size_t len;
		next = config_list_item(next, &p, &len);
		char *name = strndup(p, len);
		if (!name) {
			snprintf(why, whylen, "out of memory");
			goto out;
		}
		struct outbox_table t;
		char part[256], like[128], bare[64];
		int bad =
		    table_is_pattern(name)
			? table_pattern_parse(name, like, sizeof(like), bare,
					      sizeof(bare), part, sizeof(part))
			: table_parse(name, &t, part, sizeof(part));
		if (bad != 0) {
			if (len == 0)
				snprintf(why, whylen,
					 "an empty table name in the list");
			else
				snprintf(why, whylen,
					 "table %zu of the list: %s", count + 1,
					 part);
			free(name);
			goto out;
		}
		for (size_t i = 0; i < count; i++)
			if (strcmp(names[i], name) == 0) {
				snprintf(why, whylen,
					 "table %s is listed twice", name);
				free(name);
				goto out;
			}
		if (count == CONFIG_TABLES_MAX) {
			snprintf(why, whylen, "more than %d tables",
				 CONFIG_TABLES_MAX);
			free(name);
			goto out;
		}
		char **grown = realloc(names, (count + 1) * sizeof(*names));
		if (!grown) {
			snprintf(why, whylen, "out of memory");
			free(name);
			goto out;
		}
		names = grown;
		names[count++] = name;
	}
	rc = 0;
out:
	if (rc == 0 && out) {
		*out = names;
		*n = count;
	} else {
		for (size_t i = 0; i < count; i++)
			free(names[i]);
		free(names);
	}
	return rc;
}

bool config_has_patterns(const struct config *cfg)
{
	for (size_t i = 0; i < cfg->n_tables; i++)
		if (table_is_pattern(cfg->tables[i]))
			return true;
	return false;
}

const char *config_first_table(const struct config *cfg)
{
	for (size_t i = 0; i < cfg->n_tables; i++)
		if (!table_is_pattern(cfg->tables[i]))
			return cfg->tables[i];
	/* A config made by hand (tests) may have no list. */
	return cfg->n_tables == 0 ? cfg->table : NULL;
}

static int check_table(const char *v, char *why, size_t whylen)
{
	return split_tables(v, NULL, NULL, why, whylen);
}

bool config_has_control(const char *v)
{
	for (; *v; v++)
		if ((unsigned char)*v < 0x20 || *v == 0x7f)
			return true;
	return false;
}

bool config_host_is_local(const char *host, size_t n)
{
	static const char *const names[] = {"localhost", "localhost.", "::1",
					    "[::1]", "0:0:0:0:0:0:0:1"};

	if (n == 0 || host[0] == '/' || host[0] == '@')
		return true;
	for (size_t i = 0; i < ARRAY_SIZE(names); i++)
		if (strlen(names[i]) == n &&
		    strncasecmp(host, names[i], n) == 0)
			return true;
	/* A dotted IPv4 literal in 127.0.0.0/8; a name such as
	 * 127.example.com has letters and is not loopback. */
	if (n > 4 && strncmp(host, "127.", 4) == 0) {
		for (size_t i = 4; i < n; i++)
			if (!(host[i] == '.' ||
			      (host[i] >= '0' && host[i] <= '9')))
				return false;
		return true;
	}
	return false;
}

static int check_ce_source(const char *v, char *why, size_t whylen)
{
	if (*v == '\0' || strlen(v) > 1024 || config_has_control(v)) {
		snprintf(why, whylen,
			 "must be a non-empty URI-reference of at most 1024 "
			 "bytes");
		return -1;
	}
	return 0;
}

static int check_http_addr(const char *v, char *why, size_t whylen)
{
	const char *colon = strrchr(v, ':');
	size_t hostlen;
	int64_t port;

	if (*v == '\0')
		return 0;
	if (!colon) {
		snprintf(why, whylen,
			 "must be host:port, or empty to disable HTTP");
		return -1;
	}
	hostlen = (size_t)(colon - v);
	if (hostlen == 0) {
		snprintf(why, whylen,
			 "host missing: use 0.0.0.0:PORT for every address");
		return -1;
	}
	if (v[0] == '[' ? (hostlen < 3 || v[hostlen - 1] != ']')
			: memchr(v, ':', hostlen) != NULL) {
		snprintf(why, whylen,
			 "write an IPv6 host in brackets: [::1]:9090");
		return -1;
	}
	if (config_has_control(v) || memchr(v, ' ', hostlen)) {
		snprintf(why, whylen,
			 "host contains spaces or control "
			 "characters");
		return -1;
	}
	if (config_parse_int64(colon + 1, &port, why, whylen) != 0 ||
	    port < 1 || port > 65535) {
		snprintf(why, whylen, "port must be within 1..65535");
		return -1;
	}
	return 0;
}

#define OK(v) config_loader_ok(ld, "OUTBOX_" #v)

/* Every batch in flight is a lease the others' leases skip over (SKIP
 * LOCKED), so the default keeps a replica at two: a window of 2 for one
 * worker, none beyond the workers for several (docs/benchmark.md). */
int config_worker_window(const struct config *cfg)
{
	if (cfg->worker_window > 0)
		return cfg->worker_window;
	return cfg->workers == 1 ? 2 : 1;
}

/* docs/design.md §4: settings that would let a lease expire under a live batch.
 */
static void cross_check(struct config_loader *ld, const struct config *cfg)
{
	char a[32], b[32], c[32];

	if (OK(PUBLISH_TIMEOUT) && OK(STATEMENT_TIMEOUT) && OK(LEASE_TIMEOUT) &&
	    cfg->publish_timeout_ms + cfg->statement_timeout_ms >=
		cfg->lease_timeout_ms) {
		config_format_duration(cfg->publish_timeout_ms, a, sizeof(a));
		config_format_duration(cfg->statement_timeout_ms, b, sizeof(b));
		config_format_duration(cfg->lease_timeout_ms, c, sizeof(c));
		config_problem(
		    ld, "OUTBOX_PUBLISH_TIMEOUT", false, NULL,
		    "publish timeout %s plus OUTBOX_STATEMENT_TIMEOUT %s "
		    "(the mark budget) must be less than "
		    "OUTBOX_LEASE_TIMEOUT %s",
		    a, b, c);
	}
	if (OK(SWEEP_INTERVAL) && OK(LEASE_TIMEOUT) &&
	    cfg->sweep_interval_ms >= cfg->lease_timeout_ms) {
		config_format_duration(cfg->sweep_interval_ms, a, sizeof(a));
		config_format_duration(cfg->lease_timeout_ms, b, sizeof(b));
		config_problem(ld, "OUTBOX_SWEEP_INTERVAL", false, NULL,
			       "sweep interval %s must be less than "
			       "OUTBOX_LEASE_TIMEOUT %s",
			       a, b);
	}
	int window = config_worker_window(cfg);
	if (OK(WORKERS) && OK(WORKER_WINDOW) &&
	    cfg->workers * window > CONFIG_MAX_LANES) {
		config_problem(ld, "OUTBOX_WORKER_WINDOW", false, NULL,
			       "OUTBOX_WORKERS %d times a window of %d is "
			       "%d lanes, each with its Postgres sessions; at "
			       "most %d",
			       cfg->workers, window, cfg->workers * window,
			       CONFIG_MAX_LANES);
	}
	if (OK(BACKOFF_BASE) && OK(BACKOFF_MAX) &&
	    cfg->backoff_base_ms > cfg->backoff_max_ms) {
		config_format_duration(cfg->backoff_base_ms, a, sizeof(a));
		config_format_duration(cfg->backoff_max_ms, b, sizeof(b));
		config_problem(
		    ld, "OUTBOX_BACKOFF_BASE", false, NULL,
		    "backoff base %s must not exceed OUTBOX_BACKOFF_MAX %s", a,
		    b);
	}
	/* A shutdown awaits the acknowledgements of the batch in flight,
	 * then writes its outcomes: cut short, rows the broker took stay
	 * leased and go out again. */
	if (OK(SHUTDOWN_TIMEOUT) && OK(STATEMENT_TIMEOUT) &&
	    OK(PUBLISH_TIMEOUT) &&
	    cfg->shutdown_timeout_ms <=
		cfg->publish_timeout_ms + cfg->statement_timeout_ms) {
		config_format_duration(cfg->shutdown_timeout_ms, a, sizeof(a));
		config_format_duration(cfg->publish_timeout_ms, b, sizeof(b));
		config_format_duration(cfg->statement_timeout_ms, c, sizeof(c));
		config_problem(
		    ld, "OUTBOX_SHUTDOWN_TIMEOUT", false, NULL,
		    "shutdown timeout %s must be greater than "
		    "OUTBOX_PUBLISH_TIMEOUT %s plus OUTBOX_STATEMENT_TIMEOUT "
		    "%s, which it keeps for awaiting acknowledgements and "
		    "writing outcomes",
		    a, b, c);
	}
}

/* The extensions check the values whose rules live above config. */
static setting_check_fn *core_check(const struct config_extensions *ext,
				    const struct setting *s)
{
	if (s->offset == offsetof(struct config, database_url) ||
	    s->offset == offsetof(struct config, listen_database_url))
		return ext ? ext->check_conninfo : NULL;
	if (s->offset == offsetof(struct config, publisher))
		return ext ? ext->check_publisher : NULL;
	if (s->offset == offsetof(struct config, ce_source) && ext &&
	    ext->check_ce_source)
		return ext->check_ce_source;
	return s->check;
}

const char *config_row_help(const struct config_extensions *ext,
			    const struct setting *s)
{
	if (ext && ext->publisher_help && s >= config_core_rows &&
	    s < config_core_rows + config_core_n_rows &&
	    s->offset == offsetof(struct config, publisher))
		return ext->publisher_help;
	return s->help;
}

static const struct config_group *row_group(const struct config_group *g,
					    const char *name, size_t n)
{
	for (size_t i = 0; i < g->n_rows; i++)
		if (strlen(g->rows[i].name) == n &&
		    strncmp(g->rows[i].name, name, n) == 0)
			return g;
	return NULL;
}

static bool ends_with_file(const char *s, size_t n)
{
	size_t k = strlen(FILE_SUFFIX);
	return n >= k && strncmp(s + n - k, FILE_SUFFIX, k) == 0;
}

/* Every variable starting with g's prefix that is not one of its rows. */
static void prefix_load(struct config_loader *ld, const struct config_group *g,
			const struct config *cfg, void *data)
{
	size_t plen = strlen(g->prefix);

	for (char **e = environ; e && *e; e++) {
		size_t n = strcspn(*e, "=");
		bool is_file;
		char *var;

		if (n < plen || strncmp(*e, g->prefix, plen) != 0)
			continue;
		is_file = ends_with_file(*e + plen, n - plen);
		if (is_file)
			n -= strlen(FILE_SUFFIX);
		if (row_group(g, *e, n))
			continue;
		var = strndup(*e, n);
		if (!var) {
			config_problem(ld, g->prefix, false, NULL,
				       "out of memory");
			continue;
		}
		/* With both NAME and NAME_FILE set, NAME reports it once. */
		if (!is_file || !getenv(var))
			g->load_extra(ld, cfg, var, data);
		free(var);
	}
}

/* Allocates g's struct into the next part of cfg and fills it. */
static void group_load(struct config_loader *ld, const struct config_group *g,
		       struct config *cfg)
{
	struct config_part *part;

	if (cfg->n_parts == CONFIG_GROUPS_MAX) {
		config_problem(ld, g->n_rows ? g->rows[0].name : "OUTBOX_",
			       false, NULL, "more than %d settings groups",
			       CONFIG_GROUPS_MAX);
		return;
	}
	part = &cfg->parts[cfg->n_parts];
	part->data = calloc(1, g->size ? g->size : 1);
	if (!part->data) {
		config_problem(ld, g->n_rows ? g->rows[0].name : "OUTBOX_",
			       false, NULL, "out of memory");
		return;
	}
	part->group = g;
	cfg->n_parts++;
	for (size_t i = 0; i < g->n_rows; i++)
		setting_load(ld, &g->rows[i], g->rows[i].check, part->data);
	if (g->prefix && g->load_extra)
		prefix_load(ld, g, cfg, part->data);
}

int config_load(struct config *cfg, const struct config_extensions *ext,
		FILE *errs)
{
	struct config_loader ld = {.errs = errs};
	const struct config_group *const *groups = ext ? ext->groups : NULL;

	memset(cfg, 0, sizeof(*cfg));
	ld.warnings = cfg->warnings;
	for (size_t i = 0; i < ARRAY_SIZE(config_core_rows); i++)
		setting_load(&ld, &config_core_rows[i],
			     core_check(ext, &config_core_rows[i]), cfg);
	for (size_t g = 0; groups && groups[g]; g++)
		group_load(&ld, groups[g], cfg);
	cross_check(&ld, cfg);
	config_databases_load(&ld, cfg, ext ? ext->check_conninfo : NULL);
	if (cfg->table && config_loader_ok(&ld, "OUTBOX_TABLE")) {
		char why[256];
		if (split_tables(cfg->table, &cfg->tables, &cfg->n_tables, why,
				 sizeof(why)) != 0)
			config_problem(&ld, "OUTBOX_TABLE", false, NULL, "%s",
				       why);
		/* Names are taken as written, as if quoted; SQL folds an
		 * unquoted one to lower case: the application's INSERT
		 * INTO Orders.Outbox goes to another table. */
		for (size_t i = 0; i < cfg->n_tables; i++) {
			char lower[256];
			size_t n = 0;
			bool upper = false;
			for (const char *p = cfg->tables[i];
			     *p && n + 1 < sizeof(lower); p++) {
				upper |= *p >= 'A' && *p <= 'Z';
				lower[n++] = (char)tolower((unsigned char)*p);
			}
			lower[n] = '\0';
			if (upper)
				loader_warn(&ld,
					    "OUTBOX_TABLE: '%s' is taken as "
					    "written, upper case and all, as "
					    "if each part were quoted; SQL's "
					    "unquoted %s is %s",
					    cfg->tables[i], cfg->tables[i],
					    lower);
		}
	}
	if (errs)
		fflush(errs);
	return ld.problems;
}

void config_release(struct config *cfg)
{
	config_databases_release(cfg);
	for (size_t i = 0; i < cfg->n_tables; i++)
		free(cfg->tables[i]);
	free(cfg->tables);
	for (size_t i = 0; i < ARRAY_SIZE(config_core_rows); i++)
		setting_free(&config_core_rows[i], cfg);
	for (size_t p = 0; p < cfg->n_parts; p++) {
		const struct config_group *g = cfg->parts[p].group;

		for (size_t i = 0; i < g->n_rows; i++)
			setting_free(&g->rows[i], cfg->parts[p].data);
		if (g->release)
			g->release(cfg->parts[p].data);
		free(cfg->parts[p].data);
	}
	memset(cfg, 0, sizeof(*cfg));
}

void *config_part_of(const struct config *cfg, const struct config_group *group)
{
	for (size_t i = 0; i < cfg->n_parts; i++)
		if (cfg->parts[i].group == group)
			return cfg->parts[i].data;
	return NULL;
}

static bool group_knows(const struct config_group *g, const char *name,
			size_t n)
{
	size_t plen;

	if (row_group(g, name, n))
		return true;
	if (!g->prefix)
		return false;
	plen = strlen(g->prefix);
	return n > plen && strncmp(name, g->prefix, plen) == 0;
}

bool config_knows(const struct config_extensions *ext, const char *name)
{
	size_t n;

	if (!name)
		return false;
	n = strlen(name);
	if (ends_with_file(name, n))
		n -= strlen(FILE_SUFFIX);
	if (config_database_var(name, n))
		return true;
	for (size_t i = 0; i < ARRAY_SIZE(config_core_rows); i++)
		if (strlen(config_core_rows[i].name) == n &&
		    strncmp(config_core_rows[i].name, name, n) == 0)
			return true;
	for (size_t g = 0; ext && ext->groups && ext->groups[g]; g++)
		if (group_knows(ext->groups[g], name, n))
			return true;
	return false;
}
