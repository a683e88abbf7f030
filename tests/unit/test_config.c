/* SPDX-License-Identifier: MIT */
/*
 * Settings: defaults, every type's parsing, bad values, NAME_FILE, the
 * Kafka passthrough, the section 4 cross-checks, secret hiding, URL
 * redaction, --help/README output and config_knows(&ext, ).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "config/config.h"
#include "base/base.h"
#include "publishers/amqp_map.h"
#include "publishers/kafka.h"
#include "publishers/publisher.h"
#include "store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define OFF(f) offsetof(struct config, f)
#define AOFF(f) offsetof(struct rmq_settings, f)
#define KOFF(f) offsetof(struct kafka_settings, f)
#define KS(r) kafka_settings_of(&(r).cfg)
#define AS(r) rmq_settings_of(&(r).cfg)

static struct config_extensions ext;

static const char *const all_vars[] = {
    "OUTBOX_DATABASE_URL",
    "OUTBOX_DATABASES",
    "OUTBOX_TABLE",
    "OUTBOX_DISCOVERY_INTERVAL",
    "OUTBOX_LISTEN",
    "OUTBOX_LISTEN_DATABASE_URL",
    "OUTBOX_PG_PREPARE",
    "OUTBOX_PG_DEAD_PEER_TIMEOUT",
    "OUTBOX_STATEMENT_TIMEOUT",
    "OUTBOX_PUBLISHER",
    "OUTBOX_AMQP_URL",
    "OUTBOX_AMQP_EXCHANGE",
    "OUTBOX_AMQP_DECLARE_EXCHANGE",
    "OUTBOX_AMQP_HEADER_PREFIX",
    "OUTBOX_UNROUTABLE",
    "OUTBOX_AMQP_TLS_CA",
    "OUTBOX_AMQP_TLS_CERT",
    "OUTBOX_AMQP_TLS_KEY",
    "OUTBOX_AMQP_TLS_VERIFY",
    "OUTBOX_AMQP_SASL_MECHANISM",
    "OUTBOX_AMQP_HEARTBEAT",
    "OUTBOX_KAFKA_BROKERS",
    "OUTBOX_KAFKA_TOPIC",
    "OUTBOX_KAFKA_KEY_FROM",
    "OUTBOX_CE_SOURCE",
    "OUTBOX_CE_MODE",
    "OUTBOX_BATCH_SIZE",
    "OUTBOX_BATCH_BYTES",
    "OUTBOX_WORKERS",
    "OUTBOX_WORKER_WINDOW",
    "OUTBOX_POLL_INTERVAL",
    "OUTBOX_LEASE_INTERVAL",
    "OUTBOX_LEASE_RESCAN_INTERVAL",
    "OUTBOX_PUBLISH_TIMEOUT",
    "OUTBOX_LEASE_TIMEOUT",
    "OUTBOX_SWEEP_INTERVAL",
    "OUTBOX_CLEAN_INTERVAL",
    "OUTBOX_CLEAN_BATCH_SIZE",
    "OUTBOX_RETENTION",
    "OUTBOX_FAILED_RETENTION",
    "OUTBOX_BACKOFF_BASE",
    "OUTBOX_BACKOFF_MAX",
    "OUTBOX_BACKOFF_FACTOR",
    "OUTBOX_ORDERING",
    "OUTBOX_ORDERING_ON_FAILURE",
    "OUTBOX_MAX_RATE",
    "OUTBOX_MAX_EVENT_SIZE",
    "OUTBOX_SHUTDOWN_TIMEOUT",
    "OUTBOX_HTTP_ADDR",
    "OUTBOX_METRICS_SOURCES",
    "OUTBOX_LOG_LEVEL",
    "OUTBOX_LOG_FORMAT",
};

/* Secret settings: their values must never reach the error output. */
static const char *const secret_vars[] = {
    "OUTBOX_DATABASE_URL",
    "OUTBOX_LISTEN_DATABASE_URL",
    "OUTBOX_AMQP_URL",
};

/* Unsets every OUTBOX_* variable, restarting after each unsetenv()
 * because it rewrites environ under the loop. */
static void env_clear(void)
{
	for (;;) {
		char *name = NULL;

		for (char **e = environ; *e; e++) {
			if (strncmp(*e, "OUTBOX_", 7) == 0) {
				name = strndup(*e, strcspn(*e, "="));
				break;
			}
		}
		if (!name)
			return;
		assert_int_equal(unsetenv(name), 0);
		free(name);
	}
}

static int setup(void **state)
{
	(void)state;
	env_clear();
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	env_clear();
	return 0;
}

static void env_set(const char *name, const char *value)
{
	assert_int_equal(setenv(name, value, 1), 0);
}

struct run {
	struct config cfg;
	int problems;
	char *errs;
	size_t errlen;
};

/* Loads, captures the error lines and checks their shape: one line per
 * problem, each "config: OUTBOX_...: ". */
static void run_load(struct run *r)
{
	FILE *f;
	int lines = 0;

	memset(r, 0, sizeof(*r));
	f = open_memstream(&r->errs, &r->errlen);
	assert_non_null(f);
	r->problems = config_load(&r->cfg, &ext, f);
	assert_int_equal(fclose(f), 0);
	for (const char *p = r->errs; *p; p = strchr(p, '\n') + 1) {
		if (strncmp(p, "config: OUTBOX_", 15) != 0)
			fail_msg("malformed problem line: %s", p);
		if (!strchr(p, '\n'))
			fail_msg("problem line without newline: %s", p);
		lines++;
	}
	if (lines != r->problems)
		fail_msg("%d problems but %d lines:\n%s", r->problems, lines,
			 r->errs);
}

static void run_free(struct run *r)
{
	config_release(&r->cfg);
	free(r->errs);
	r->errs = NULL;
}

static bool is_secret_var(const char *var)
{
	for (size_t i = 0; i < ARRAY_SIZE(secret_vars); i++)
		if (strcmp(secret_vars[i], var) == 0)
			return true;
	return false;
}

/* A temporary file holding len bytes of content; path gets its name. */
static void temp_file(const void *content, size_t len, char *path,
		      size_t pathlen)
{
	int fd;

	snprintf(path, pathlen, "%s/test_config.XXXXXX", P_tmpdir);
	fd = mkstemp(path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, content, len), (ssize_t)len);
	assert_int_equal(close(fd), 0);
}

static void temp_text(const char *content, char *path, size_t pathlen)
{
	temp_file(content, strlen(content), path, pathlen);
}

static void test_defaults(void **state)
{
	struct run r;

	(void)state;
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_string_equal(r.errs, "");

	assert_null(r.cfg.database_url);
	assert_string_equal(r.cfg.table, "outbox_events");
	assert_null(r.cfg.listen_database_url);
	assert_false(r.cfg.listen);
	assert_int_equal(r.cfg.pg_prepare, PG_PREPARE_ON);
	assert_int_equal(r.cfg.statement_timeout_ms, 10000);

	assert_string_equal(r.cfg.publisher, "stdout");
	assert_string_equal(AS(r)->url, "amqp://guest:guest@127.0.0.1:5672");
	assert_string_equal(AS(r)->exchange, "");
	assert_false(AS(r)->declare_exchange);
	assert_string_equal(AS(r)->header_prefix, "ce-");
	assert_int_equal(AS(r)->unroutable, UNROUTABLE_RETRY);
	assert_string_equal(KS(r)->brokers, "127.0.0.1:9092");
	assert_string_equal(KS(r)->topic, "outbox");
	assert_int_equal(KS(r)->key_from, KEY_FROM_PARTITION_KEY);
	assert_null(KS(r)->props);
	assert_int_equal(KS(r)->n_props, 0);

	assert_string_equal(r.cfg.ce_source, "/outbox-relay");
	assert_int_equal(r.cfg.ce_mode, CE_MODE_BINARY);

	assert_int_equal(r.cfg.batch_size, 100);
	assert_int_equal(r.cfg.workers, 1);
	assert_int_equal(r.cfg.poll_interval_ms, 2000);
	assert_int_equal(r.cfg.publish_timeout_ms, 5000);
	assert_int_equal(r.cfg.lease_timeout_ms, 60000);
	assert_int_equal(r.cfg.sweep_interval_ms, 30000);
	assert_int_equal(r.cfg.clean_interval_ms, 3600000);
	assert_int_equal(r.cfg.retention_ms, 86400000);
	assert_int_equal(r.cfg.failed_retention_ms, 7 * 86400000LL);
	assert_int_equal(r.cfg.clean_batch_size, 1000);
	assert_int_equal(r.cfg.backoff_base_ms, 2000);
	assert_int_equal(r.cfg.backoff_max_ms, 300000);
	assert_true(r.cfg.backoff_factor == 2.0);
	assert_int_equal(r.cfg.ordering, ORDERING_NONE);
	assert_int_equal(r.cfg.on_failure, ON_FAILURE_SKIP);
	assert_true(r.cfg.max_rate == 0.0);
	assert_int_equal(r.cfg.max_event_size, 16 * 1048576);
	assert_int_equal(r.cfg.shutdown_timeout_ms, 25000);

	assert_string_equal(r.cfg.http_addr, "0.0.0.0:9090");
	assert_int_equal(r.cfg.log_level, LOG_INFO);
	assert_int_equal(r.cfg.log_format, LOG_FORMAT_JSON);
	run_free(&r);
}

enum kind { K_STR, K_NULL, K_BOOL, K_INT, K_I64, K_DBL, K_ENUM };

struct good_case {
	const char *var;
	const char *value;
	enum kind kind;
	size_t off;
	int64_t i;     /* K_BOOL, K_INT, K_I64, K_ENUM */
	double d;      /* K_DBL */
	const char *s; /* K_STR */
};

/* The longest table name part base's table_parse() takes: 43 bytes. */
static const char name43[] = "t123456789012345678901234567890123456789012";

static const struct good_case good_cases[] = {
    {"OUTBOX_DATABASE_URL", "postgres://u:p@db:5432/app", K_STR,
     OFF(database_url), 0, 0, "postgres://u:p@db:5432/app"},
    {"OUTBOX_DATABASE_URL", "host=db dbname=app", K_STR, OFF(database_url), 0,
     0, "host=db dbname=app"},
    {"OUTBOX_DATABASE_URL",
     "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write", K_STR,
     OFF(database_url), 0, 0,
     "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write"},
    {"OUTBOX_DATABASE_URL", "", K_NULL, OFF(database_url), 0, 0, NULL},
    {"OUTBOX_TABLE", "app.outbox_events", K_STR, OFF(table), 0, 0,
     "app.outbox_events"},
    {"OUTBOX_TABLE", "_Outbox_2", K_STR, OFF(table), 0, 0, "_Outbox_2"},
    {"OUTBOX_TABLE", name43, K_STR, OFF(table), 0, 0, name43},
    {"OUTBOX_LISTEN", "on", K_BOOL, OFF(listen), 1, 0, NULL},
    {"OUTBOX_LISTEN", "true", K_BOOL, OFF(listen), 1, 0, NULL},
    {"OUTBOX_LISTEN_DATABASE_URL", "host=primary", K_STR,
     OFF(listen_database_url), 0, 0, "host=primary"},
    {"OUTBOX_PG_PREPARE", "off", K_ENUM, OFF(pg_prepare), PG_PREPARE_OFF, 0,
     NULL},
    {"OUTBOX_PG_PREPARE", "false", K_ENUM, OFF(pg_prepare), PG_PREPARE_OFF, 0,
     NULL},
    {"OUTBOX_PG_PREPARE", "true", K_ENUM, OFF(pg_prepare), PG_PREPARE_ON, 0,
     NULL},
    {"OUTBOX_PG_PREPARE", "pooled", K_ENUM, OFF(pg_prepare), PG_PREPARE_POOLED,
     0, NULL},
    {"OUTBOX_STATEMENT_TIMEOUT", "19s", K_I64, OFF(statement_timeout_ms), 19000,
     0, NULL},
    {"OUTBOX_PUBLISHER", "amqp", K_STR, OFF(publisher), 0, 0, "amqp"},
    {"OUTBOX_PUBLISHER", "kafka", K_STR, OFF(publisher), 0, 0, "kafka"},
    {"OUTBOX_AMQP_URL", "amqps://u:p@rabbit:5671/vh", K_STR, AOFF(url), 0, 0,
     "amqps://u:p@rabbit:5671/vh"},
    {"OUTBOX_AMQP_URL", "amqp://h:5672/%2f", K_STR, AOFF(url), 0, 0,
     "amqp://h:5672/%2f"},
    {"OUTBOX_AMQP_EXCHANGE", "events", K_STR, AOFF(exchange), 0, 0, "events"},
    {"OUTBOX_AMQP_DECLARE_EXCHANGE", "on", K_BOOL, AOFF(declare_exchange), 1, 0,
     NULL},
    {"OUTBOX_AMQP_HEADER_PREFIX", "cloudEvents_", K_STR, AOFF(header_prefix), 0,
     0, "cloudEvents_"},
    {"OUTBOX_UNROUTABLE", "fail", K_ENUM, AOFF(unroutable), UNROUTABLE_FAIL, 0,
     NULL},
    {"OUTBOX_KAFKA_BROKERS", "k1:9092,k2:9092", K_STR, KOFF(brokers), 0, 0,
     "k1:9092,k2:9092"},
    {"OUTBOX_KAFKA_TOPIC", "orders.v1-x_y", K_STR, KOFF(topic), 0, 0,
     "orders.v1-x_y"},
    {"OUTBOX_KAFKA_KEY_FROM", "routing_key", K_ENUM, KOFF(key_from),
     KEY_FROM_ROUTING_KEY, 0, NULL},
    {"OUTBOX_CE_SOURCE", "urn:example:orders", K_STR, OFF(ce_source), 0, 0,
     "urn:example:orders"},
    {"OUTBOX_CE_MODE", "structured", K_ENUM, OFF(ce_mode), CE_MODE_STRUCTURED,
     0, NULL},
    {"OUTBOX_BATCH_SIZE", "1", K_INT, OFF(batch_size), 1, 0, NULL},
    {"OUTBOX_BATCH_SIZE", "10000", K_INT, OFF(batch_size), 10000, 0, NULL},
    {"OUTBOX_WORKERS", "64", K_INT, OFF(workers), 64, 0, NULL},
    {"OUTBOX_WORKER_WINDOW", "8", K_INT, OFF(worker_window), 8, 0, NULL},
    {"OUTBOX_POLL_INTERVAL", "10ms", K_I64, OFF(poll_interval_ms), 10, 0, NULL},
    {"OUTBOX_LEASE_INTERVAL", "3ms", K_I64, OFF(lease_interval_ms), 3, 0, NULL},
    {"OUTBOX_LEASE_INTERVAL", "1s", K_I64, OFF(lease_interval_ms), 1000, 0,
     NULL},
    {"OUTBOX_LEASE_RESCAN_INTERVAL", "0", K_I64, OFF(lease_rescan_ms), 0, 0,
     NULL},
    {"OUTBOX_LEASE_RESCAN_INTERVAL", "1s", K_I64, OFF(lease_rescan_ms), 1000, 0,
     NULL},
    {"OUTBOX_LEASE_RESCAN_INTERVAL", "1h", K_I64, OFF(lease_rescan_ms), 3600000,
     0, NULL},
    {"OUTBOX_PUBLISH_TIMEOUT", "100ms", K_I64, OFF(publish_timeout_ms), 100, 0,
     NULL},
    {"OUTBOX_LEASE_TIMEOUT", "5m", K_I64, OFF(lease_timeout_ms), 300000, 0,
     NULL},
    {"OUTBOX_PG_DEAD_PEER_TIMEOUT", "30s", K_I64, OFF(pg_dead_peer_ms), 30000,
     0, NULL},
    {"OUTBOX_SWEEP_INTERVAL", "100ms", K_I64, OFF(sweep_interval_ms), 100, 0,
     NULL},
    {"OUTBOX_CLEAN_INTERVAL", "1d", K_I64, OFF(clean_interval_ms), 86400000, 0,
     NULL},
    {"OUTBOX_CLEAN_BATCH_SIZE", "100000", K_INT, OFF(clean_batch_size), 100000,
     0, NULL},
    {"OUTBOX_RETENTION", "1m", K_I64, OFF(retention_ms), 60000, 0, NULL},
    /* 0: no history, a row is deleted on its acknowledgement. */
    {"OUTBOX_RETENTION", "0", K_I64, OFF(retention_ms), 0, 0, NULL},
    {"OUTBOX_BATCH_BYTES", "1MiB", K_I64, OFF(batch_bytes), 1048576, 0, NULL},
    {"OUTBOX_RETENTION", "3650d", K_I64, OFF(retention_ms), 3650 * 86400000LL,
     0, NULL},
    {"OUTBOX_FAILED_RETENTION", "0", K_I64, OFF(failed_retention_ms), 0, 0,
     NULL},
    {"OUTBOX_FAILED_RETENTION", "30d", K_I64, OFF(failed_retention_ms),
     30 * 86400000LL, 0, NULL},
    {"OUTBOX_BACKOFF_BASE", "100ms", K_I64, OFF(backoff_base_ms), 100, 0, NULL},
    {"OUTBOX_BACKOFF_MAX", "7d", K_I64, OFF(backoff_max_ms), 7 * 86400000LL, 0,
     NULL},
    {"OUTBOX_BACKOFF_FACTOR", "1", K_DBL, OFF(backoff_factor), 0, 1.0, NULL},
    {"OUTBOX_BACKOFF_FACTOR", "1.5", K_DBL, OFF(backoff_factor), 0, 1.5, NULL},
    {"OUTBOX_BACKOFF_FACTOR", "10", K_DBL, OFF(backoff_factor), 0, 10.0, NULL},
    {"OUTBOX_ORDERING", "partition", K_ENUM, OFF(ordering), ORDERING_PARTITION,
     0, NULL},
    {"OUTBOX_ORDERING_ON_FAILURE", "block", K_ENUM, OFF(on_failure),
     ON_FAILURE_BLOCK, 0, NULL},
    {"OUTBOX_MAX_RATE", "0.5", K_DBL, OFF(max_rate), 0, 0.5, NULL},
    {"OUTBOX_MAX_RATE", "1000000", K_DBL, OFF(max_rate), 0, 1e6, NULL},
    {"OUTBOX_MAX_EVENT_SIZE", "1KiB", K_I64, OFF(max_event_size), 1024, 0,
     NULL},
    {"OUTBOX_MAX_EVENT_SIZE", "1500B", K_I64, OFF(max_event_size), 1500, 0,
     NULL},
    {"OUTBOX_MAX_EVENT_SIZE", "512KiB", K_I64, OFF(max_event_size), 524288, 0,
     NULL},
    {"OUTBOX_MAX_EVENT_SIZE", "64MiB", K_I64, OFF(max_event_size), 64 * 1048576,
     0, NULL},
    {"OUTBOX_MAX_EVENT_SIZE", "1GiB", K_I64, OFF(max_event_size), 1073741824, 0,
     NULL},
    {"OUTBOX_SHUTDOWN_TIMEOUT", "16s", K_I64, OFF(shutdown_timeout_ms), 16000,
     0, NULL},
    {"OUTBOX_HTTP_ADDR", "127.0.0.1:8080", K_STR, OFF(http_addr), 0, 0,
     "127.0.0.1:8080"},
    {"OUTBOX_HTTP_ADDR", "[::]:9090", K_STR, OFF(http_addr), 0, 0, "[::]:9090"},
    {"OUTBOX_HTTP_ADDR", "localhost:65535", K_STR, OFF(http_addr), 0, 0,
     "localhost:65535"},
    {"OUTBOX_HTTP_ADDR", "", K_STR, OFF(http_addr), 0, 0, ""},
    {"OUTBOX_LOG_LEVEL", "debug", K_ENUM, OFF(log_level), LOG_DEBUG, 0, NULL},
    {"OUTBOX_LOG_LEVEL", "warn", K_ENUM, OFF(log_level), LOG_WARN, 0, NULL},
    {"OUTBOX_LOG_LEVEL", "error", K_ENUM, OFF(log_level), LOG_ERROR, 0, NULL},
    {"OUTBOX_LOG_FORMAT", "text", K_ENUM, OFF(log_format), LOG_FORMAT_TEXT, 0,
     NULL},
};

/* The struct c->off is into: the backend's settings for its variables. */
static const void *good_target(const struct good_case *c,
			       const struct config *cfg)
{
	if (strncmp(c->var, "OUTBOX_AMQP_", 12) == 0 ||
	    strcmp(c->var, "OUTBOX_UNROUTABLE") == 0)
		return rmq_settings_of(cfg);
	if (strncmp(c->var, "OUTBOX_KAFKA_", 13) == 0)
		return kafka_settings_of(cfg);
	return cfg;
}

static void check_good(const struct good_case *c, struct config *cfg)
{
	const char *field = (const char *)good_target(c, cfg) + c->off;
	const char *s;
	int64_t i64;
	double d;
	bool b;
	int i;

	switch (c->kind) {
	case K_STR:
	case K_NULL:
		memcpy(&s, field, sizeof(s));
		if (c->kind == K_NULL ? s != NULL
				      : (!s || strcmp(s, c->s) != 0))
			fail_msg("%s=%s: got '%s'", c->var, c->value,
				 s ? s : "(null)");
		break;
	case K_BOOL:
		memcpy(&b, field, sizeof(b));
		if (b != (c->i != 0))
			fail_msg("%s=%s: got %d", c->var, c->value, b);
		break;
	case K_INT:
	case K_ENUM:
		memcpy(&i, field, sizeof(i));
		if (i != c->i)
			fail_msg("%s=%s: got %d", c->var, c->value, i);
		break;
	case K_I64:
		memcpy(&i64, field, sizeof(i64));
		if (i64 != c->i)
			fail_msg("%s=%s: got %lld", c->var, c->value,
				 (long long)i64);
		break;
	case K_DBL:
		memcpy(&d, field, sizeof(d));
		if (d != c->d)
			fail_msg("%s=%s: got %g", c->var, c->value, d);
		break;
	}
}

static void test_good_values(void **state)
{
	(void)state;
	for (size_t n = 0; n < ARRAY_SIZE(good_cases); n++) {
		const struct good_case *c = &good_cases[n];
		struct run r;

		env_clear();
		env_set(c->var, c->value);
		run_load(&r);
		if (r.problems != 0)
			fail_msg("%s=%s: %d problems:\n%s", c->var, c->value,
				 r.problems, r.errs);
		check_good(c, &r.cfg);
		run_free(&r);
	}
}

struct bad_case {
	const char *var;
	const char *value;
};

static const char name44[] = "t1234567890123456789012345678901234567890123";
static const char long_exchange[] =
    "e123456789012345678901234567890123456789012345678901234567890123"
    "e123456789012345678901234567890123456789012345678901234567890123"
    "e123456789012345678901234567890123456789012345678901234567890123"
    "e1234567890123456789012345678901234567890123456789012345678901234";
static const char long_topic[] =
    "t123456789012345678901234567890123456789012345678901234567890123"
    "t123456789012345678901234567890123456789012345678901234567890123"
    "t123456789012345678901234567890123456789012345678901234567890123"
    "t12345678901234567890123456789012345678901234567890123456789";

static const struct bad_case bad_cases[] = {
    {"OUTBOX_DATABASE_URL", "host=db bogus=1"},
    {"OUTBOX_DATABASE_URL", "host='unterminated"},
    {"OUTBOX_DATABASE_URL", "postgresql://u@[::1"},
    {"OUTBOX_TABLE", ""},
    {"OUTBOX_TABLE", "1outbox"},
    {"OUTBOX_TABLE", "a.b.c"},
    {"OUTBOX_TABLE", "out-box"},
    {"OUTBOX_TABLE", "app."},
    {"OUTBOX_TABLE", ".outbox"},
    {"OUTBOX_TABLE", "x;drop table y"},
    {"OUTBOX_TABLE", name44},
    {"OUTBOX_TABLE", "a,,b"},
    {"OUTBOX_TABLE", "a,"},
    {"OUTBOX_TABLE", "a, b, a"},
    {"OUTBOX_TABLE", "a,b-c"},
    {"OUTBOX_TABLE", "*"},
    {"OUTBOX_TABLE", "*.out*"},
    {"OUTBOX_TABLE", "t-*.outbox"},
    {"OUTBOX_TABLE", "tenant_*"},
    {"OUTBOX_LISTEN", "1"},
    {"OUTBOX_LISTEN", "yes"},
    {"OUTBOX_LISTEN", "ON"},
    {"OUTBOX_LISTEN_DATABASE_URL", "host=db nosuchoption=1"},
    {"OUTBOX_PG_PREPARE", "maybe"},
    {"OUTBOX_PG_PREPARE", ""},
    {"OUTBOX_STATEMENT_TIMEOUT", "0"},
    {"OUTBOX_STATEMENT_TIMEOUT", "50ms"},
    {"OUTBOX_STATEMENT_TIMEOUT", "2h"},
    {"OUTBOX_PUBLISHER", "rabbit"},
    {"OUTBOX_PUBLISHER", "Kafka"},
    {"OUTBOX_PUBLISHER", ""},
    {"OUTBOX_AMQP_URL", "http://h/"},
    {"OUTBOX_AMQP_URL", "amqp://h:notaport/"},
    {"OUTBOX_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"},
    {"OUTBOX_AMQP_URL", ""},
    {"OUTBOX_AMQP_EXCHANGE", long_exchange},
    {"OUTBOX_AMQP_EXCHANGE", "a\nb"},
    {"OUTBOX_AMQP_DECLARE_EXCHANGE", "yes"},
    {"OUTBOX_AMQP_HEADER_PREFIX", "cloudevents_"},
    {"OUTBOX_AMQP_HEADER_PREFIX", "x-"},
    {"OUTBOX_UNROUTABLE", "drop"},
    {"OUTBOX_KAFKA_BROKERS", ""},
    {"OUTBOX_KAFKA_BROKERS", "k1:9092,,k2:9092"},
    {"OUTBOX_KAFKA_BROKERS", "k1:9092, "},
    {"OUTBOX_KAFKA_TOPIC", ""},
    {"OUTBOX_KAFKA_TOPIC", "a b"},
    {"OUTBOX_KAFKA_TOPIC", ".."},
    {"OUTBOX_KAFKA_TOPIC", long_topic},
    {"OUTBOX_KAFKA_KEY_FROM", "id"},
    {"OUTBOX_CE_SOURCE", ""},
    {"OUTBOX_CE_SOURCE", "a\tb"},
    {"OUTBOX_CE_MODE", "batched"},
    {"OUTBOX_BATCH_SIZE", "0"},
    {"OUTBOX_BATCH_SIZE", "10001"},
    {"OUTBOX_BATCH_SIZE", "-5"},
    {"OUTBOX_BATCH_SIZE", "abc"},
    {"OUTBOX_BATCH_SIZE", "10x"},
    {"OUTBOX_BATCH_SIZE", " 5"},
    {"OUTBOX_BATCH_SIZE", "+5"},
    {"OUTBOX_BATCH_SIZE", ""},
    {"OUTBOX_BATCH_SIZE", "1.5"},
    {"OUTBOX_BATCH_SIZE", "99999999999999999999"},
    {"OUTBOX_WORKERS", "0"},
    {"OUTBOX_WORKERS", "65"},
    {"OUTBOX_WORKER_WINDOW", "9"},
    {"OUTBOX_WORKER_WINDOW", "-1"},
    {"OUTBOX_POLL_INTERVAL", "5ms"},
    {"OUTBOX_LEASE_INTERVAL", "0ms"},
    {"OUTBOX_LEASE_INTERVAL", "2s"},
    {"OUTBOX_LEASE_RESCAN_INTERVAL", "500ms"},
    {"OUTBOX_LEASE_RESCAN_INTERVAL", "2h"},
    {"OUTBOX_POLL_INTERVAL", "2"},
    {"OUTBOX_PUBLISH_TIMEOUT", "50ms"},
    {"OUTBOX_LEASE_TIMEOUT", "500ms"},
    {"OUTBOX_PG_DEAD_PEER_TIMEOUT", "1s"},
    {"OUTBOX_PG_DEAD_PEER_TIMEOUT", "11m"},
    {"OUTBOX_PG_DEAD_PEER_TIMEOUT", "soon"},
    {"OUTBOX_LEASE_TIMEOUT", "0"},
    {"OUTBOX_SWEEP_INTERVAL", "0"},
    {"OUTBOX_CLEAN_INTERVAL", "0"},
    {"OUTBOX_CLEAN_BATCH_SIZE", "0"},
    {"OUTBOX_CLEAN_BATCH_SIZE", "100001"},
    {"OUTBOX_RETENTION", "1s"},
    {"OUTBOX_FAILED_RETENTION", "1s"},
    {"OUTBOX_FAILED_RETENTION", "3651d"},
    {"OUTBOX_BACKOFF_BASE", "0"},
    {"OUTBOX_BACKOFF_BASE", "1x"},
    {"OUTBOX_BACKOFF_MAX", "50ms"},
    {"OUTBOX_BACKOFF_FACTOR", "0.5"},
    {"OUTBOX_BACKOFF_FACTOR", "11"},
    {"OUTBOX_BACKOFF_FACTOR", "abc"},
    {"OUTBOX_BACKOFF_FACTOR", "nan"},
    {"OUTBOX_BACKOFF_FACTOR", "inf"},
    {"OUTBOX_BACKOFF_FACTOR", "0x2"},
    {"OUTBOX_BACKOFF_FACTOR", "2 "},
    {"OUTBOX_BACKOFF_FACTOR", ""},
    {"OUTBOX_ORDERING", "strict"},
    {"OUTBOX_ORDERING_ON_FAILURE", "retry"},
    {"OUTBOX_MAX_RATE", "-1"},
    {"OUTBOX_MAX_RATE", "fast"},
    {"OUTBOX_MAX_RATE", "1e7"},
    {"OUTBOX_MAX_RATE", "1e999"},
    {"OUTBOX_MAX_EVENT_SIZE", "1048576"},
    {"OUTBOX_MAX_EVENT_SIZE", "1MB"},
    {"OUTBOX_MAX_EVENT_SIZE", "1mib"},
    {"OUTBOX_MAX_EVENT_SIZE", "0"},
    {"OUTBOX_MAX_EVENT_SIZE", "1023B"},
    {"OUTBOX_MAX_EVENT_SIZE", "2GiB"},
    {"OUTBOX_MAX_EVENT_SIZE", "-1KiB"},
    {"OUTBOX_MAX_EVENT_SIZE", " 1KiB"},
    {"OUTBOX_MAX_EVENT_SIZE", "1.5MiB"},
    {"OUTBOX_MAX_EVENT_SIZE", "99999999999999999999GiB"},
    {"OUTBOX_MAX_EVENT_SIZE", "9999999999999GiB"},
    {"OUTBOX_SHUTDOWN_TIMEOUT", "0"},
    {"OUTBOX_HTTP_ADDR", "9090"},
    {"OUTBOX_HTTP_ADDR", ":9090"},
    {"OUTBOX_HTTP_ADDR", "h:0"},
    {"OUTBOX_HTTP_ADDR", "h:65536"},
    {"OUTBOX_HTTP_ADDR", "h:-1"},
    {"OUTBOX_HTTP_ADDR", "h:http"},
    {"OUTBOX_HTTP_ADDR", "h:"},
    {"OUTBOX_HTTP_ADDR", "::1:9090"},
    {"OUTBOX_HTTP_ADDR", "[::1:9090"},
    {"OUTBOX_HTTP_ADDR", "my host:9090"},
    {"OUTBOX_LOG_LEVEL", "verbose"},
    {"OUTBOX_LOG_LEVEL", ""},
    {"OUTBOX_LOG_FORMAT", "xml"},
};

/* True when v needs no escaping in the "(got '...')" suffix. */
static bool printable(const char *v)
{
	for (; *v; v++)
		if ((unsigned char)*v < 0x20 || *v == '\'' || *v == '\\')
			return false;
	return true;
}

static void test_bad_values(void **state)
{
	(void)state;
	for (size_t n = 0; n < ARRAY_SIZE(bad_cases); n++) {
		const struct bad_case *c = &bad_cases[n];
		char prefix[128], got[512];
		struct run r;

		env_clear();
		env_set(c->var, c->value);
		run_load(&r);
		snprintf(prefix, sizeof(prefix), "config: %s: ", c->var);
		if (r.problems != 1 ||
		    strncmp(r.errs, prefix, strlen(prefix)) != 0)
			fail_msg("%s='%s': expected one problem naming it, "
				 "got %d:\n%s",
				 c->var, c->value, r.problems, r.errs);
		if (is_secret_var(c->var)) {
			if (!strstr(r.errs, "(value hidden)"))
				fail_msg("%s: secret not marked hidden: %s",
					 c->var, r.errs);
		} else if (printable(c->value) && strlen(c->value) < 120) {
			snprintf(got, sizeof(got), "(got '%s')\n", c->value);
			if (!strstr(r.errs, got))
				fail_msg("%s: value not quoted: %s", c->var,
					 r.errs);
		} else if (!strstr(r.errs, "(got '")) {
			fail_msg("%s: value not quoted: %s", c->var, r.errs);
		}
		run_free(&r);
	}
}

/* Values with control characters stay on one escaped line. */
static void test_bad_value_escaped(void **state)
{
	struct run r;

	(void)state;
	env_set("OUTBOX_CE_SOURCE", "a\nb'c");
	run_load(&r);
	assert_int_equal(r.problems, 1);
	assert_non_null(strstr(r.errs, "(got 'a\\x0ab\\'c')\n"));
	run_free(&r);
}

struct duration_case {
	const char *var;
	const char *value;
	int64_t ms; /* -1: refused */
};

static const struct duration_case duration_cases[] = {
    {"OUTBOX_POLL_INTERVAL", "500ms", 500},
    {"OUTBOX_PUBLISH_TIMEOUT", "2s", 2000},
    {"OUTBOX_BACKOFF_MAX", "1m", 60000},
    {"OUTBOX_LEASE_TIMEOUT", "2m", 120000},
    {"OUTBOX_CLEAN_INTERVAL", "1h", 3600000},
    {"OUTBOX_FAILED_RETENTION", "8d", 8 * 86400000LL},
    {"OUTBOX_FAILED_RETENTION", "0", 0},
    {"OUTBOX_FAILED_RETENTION", "0d", 0},
    {"OUTBOX_RETENTION", "90m", 5400000},
    {"OUTBOX_POLL_INTERVAL", "1500ms", 1500},
    {"OUTBOX_RETENTION", "5", -1},
    {"OUTBOX_RETENTION", "-1s", -1},
    {"OUTBOX_RETENTION", "1x", -1},
    {"OUTBOX_RETENTION", "", -1},
    {"OUTBOX_RETENTION", "99999999999999999d", -1},
    {"OUTBOX_RETENTION", "9223372036854775808ms", -1},
    {"OUTBOX_RETENTION", "9223372036854775807ms", -1},
    {"OUTBOX_RETENTION", "1.5h", -1},
    {"OUTBOX_RETENTION", "1 h", -1},
    {"OUTBOX_RETENTION", "h", -1},
    {"OUTBOX_RETENTION", "1H", -1},
    {"OUTBOX_RETENTION", "1h ", -1},
    {"OUTBOX_RETENTION", " 1h", -1},
    {"OUTBOX_RETENTION", "+1h", -1},
    {"OUTBOX_RETENTION", "0x10s", -1},
    {"OUTBOX_RETENTION", "1h30m", -1},
    {"OUTBOX_RETENTION", "00", -1},
};

static int64_t duration_field(const struct config *cfg, const char *var)
{
	if (strcmp(var, "OUTBOX_POLL_INTERVAL") == 0)
		return cfg->poll_interval_ms;
	if (strcmp(var, "OUTBOX_PUBLISH_TIMEOUT") == 0)
		return cfg->publish_timeout_ms;
	if (strcmp(var, "OUTBOX_BACKOFF_MAX") == 0)
		return cfg->backoff_max_ms;
	if (strcmp(var, "OUTBOX_LEASE_TIMEOUT") == 0)
		return cfg->lease_timeout_ms;
	if (strcmp(var, "OUTBOX_CLEAN_INTERVAL") == 0)
		return cfg->clean_interval_ms;
	if (strcmp(var, "OUTBOX_FAILED_RETENTION") == 0)
		return cfg->failed_retention_ms;
	if (strcmp(var, "OUTBOX_RETENTION") == 0)
		return cfg->retention_ms;
	fail_msg("no field for %s", var);
	return -1;
}

static void test_durations(void **state)
{
	(void)state;
	for (size_t n = 0; n < ARRAY_SIZE(duration_cases); n++) {
		const struct duration_case *c = &duration_cases[n];
		struct run r;

		env_clear();
		env_set(c->var, c->value);
		run_load(&r);
		if (c->ms >= 0) {
			if (r.problems != 0 ||
			    duration_field(&r.cfg, c->var) != c->ms)
				fail_msg(
				    "%s=%s: want %lld ms, %d problems:\n%s",
				    c->var, c->value, (long long)c->ms,
				    r.problems, r.errs);
		} else if (r.problems != 1 || !strstr(r.errs, c->var)) {
			fail_msg("%s='%s' accepted or unnamed: %s", c->var,
				 c->value, r.errs);
		}
		run_free(&r);
	}
}

static void test_duration_messages(void **state)
{
	struct run r;

	(void)state;
	env_set("OUTBOX_RETENTION", "99999999999999999d");
	env_set("OUTBOX_LEASE_TIMEOUT", "60");
	env_set("OUTBOX_POLL_INTERVAL", "2h");
	run_load(&r);
	assert_int_equal(r.problems, 3);
	assert_non_null(strstr(r.errs, "config: OUTBOX_RETENTION: duration "
				       "too large (got '99999999999999999d')"));
	assert_non_null(strstr(r.errs, "config: OUTBOX_LEASE_TIMEOUT: not a "
				       "duration"));
	assert_non_null(strstr(r.errs, "config: OUTBOX_POLL_INTERVAL: out of "
				       "range; allowed 10ms..1h (got '2h')"));
	run_free(&r);
}

static void test_file_values(void **state)
{
	char table[256], crlf[256], twice[256];
	struct run r;

	(void)state;
	temp_text("app.events\n", table, sizeof(table));
	temp_text("b1:9092\r\n", crlf, sizeof(crlf));
	/* Only one newline is stripped: the second belongs to the value. */
	temp_text("user\n\n", twice, sizeof(twice));
	env_set("OUTBOX_TABLE_FILE", table);
	env_set("OUTBOX_KAFKA_BROKERS_FILE", crlf);
	env_set("OUTBOX_KAFKA_SASL_USERNAME_FILE", twice);
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_string_equal(r.cfg.table, "app.events");
	assert_string_equal(KS(r)->brokers, "b1:9092");
	assert_int_equal(KS(r)->n_props, 1);
	assert_string_equal(KS(r)->props[0].name, "sasl.username");
	assert_string_equal(KS(r)->props[0].value, "user\n");
	run_free(&r);
	unlink(table);
	unlink(crlf);
	unlink(twice);
}

static void test_file_problems(void **state)
{
	char ok[256], nul[256], missing[300];
	struct run r;

	(void)state;
	temp_text("outbox\n", ok, sizeof(ok));
	temp_file("a\0b", 3, nul, sizeof(nul));
	snprintf(missing, sizeof(missing), "%s.missing", ok);

	env_set("OUTBOX_TABLE", "outbox");
	env_set("OUTBOX_TABLE_FILE", ok);
	run_load(&r);
	assert_int_equal(r.problems, 1);
	assert_non_null(strstr(r.errs, "config: OUTBOX_TABLE: both "
				       "OUTBOX_TABLE and OUTBOX_TABLE_FILE"));
	run_free(&r);

	env_clear();
	env_set("OUTBOX_DATABASE_URL_FILE", missing);
	run_load(&r);
	assert_int_equal(r.problems, 1);
	assert_non_null(strstr(r.errs, "config: OUTBOX_DATABASE_URL_FILE: "
				       "cannot read '"));
	assert_non_null(strstr(r.errs, missing));
	assert_non_null(strstr(r.errs, "No such file"));
	run_free(&r);

	env_clear();
	env_set("OUTBOX_CE_SOURCE_FILE", nul);
	env_set("OUTBOX_WORKERS_FILE", "");
	run_load(&r);
	assert_int_equal(r.problems, 2);
	assert_non_null(
	    strstr(r.errs, "config: OUTBOX_CE_SOURCE_FILE: file '"));
	assert_non_null(strstr(r.errs, "contains a NUL byte"));
	assert_non_null(strstr(r.errs, "config: OUTBOX_WORKERS_FILE: empty "
				       "file path"));
	run_free(&r);
	unlink(ok);
	unlink(nul);

	/* A secret's file mapped to the wrong setting: the value read from
	 * it is refused without being echoed, whichever setting it is. */
	char url[256];
	temp_text("postgres://relay:S3cretPw@db/app\n", url, sizeof(url));
	env_clear();
	env_set("OUTBOX_TABLE_FILE", url);
	env_set("OUTBOX_KAFKA_CLIENT_ID_FILE", url);
	run_load(&r);
	unlink(url);
	assert_true(r.problems >= 1);
	assert_non_null(strstr(r.errs, "config: OUTBOX_TABLE: "));
	assert_non_null(strstr(r.errs, "(value hidden)"));
	if (strstr(r.errs, "S3cret"))
		fail_msg("a value read from a file was echoed: %s", r.errs);
	run_free(&r);
}

/* NAME_FILE names a regular file: a FIFO (which hung startup waiting for
 * a writer), a directory or a device is a clear problem, at once. A file
 * every user can read is read, with a warning. */
static void test_file_not_regular(void **state)
{
	char dir[256], fifo[300], path[256];
	struct run r;

	(void)state;
	snprintf(dir, sizeof(dir), "%s/test_config.XXXXXX", P_tmpdir);
	assert_non_null(mkdtemp(dir));
	snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
	assert_int_equal(mkfifo(fifo, 0600), 0);

	env_clear();
	env_set("OUTBOX_DATABASE_URL_FILE", fifo);
	env_set("OUTBOX_TABLE_FILE", dir);
	env_set("OUTBOX_CE_SOURCE_FILE", "/dev/null");
	run_load(&r);
	assert_int_equal(r.problems, 3);
	assert_non_null(strstr(r.errs, "config: OUTBOX_DATABASE_URL_FILE: '"));
	assert_non_null(strstr(r.errs, "/fifo' is a FIFO: name a regular "
				       "file\n"));
	assert_non_null(strstr(r.errs, "config: OUTBOX_TABLE_FILE: '"));
	assert_non_null(strstr(r.errs, "' is a directory: name a regular "
				       "file\n"));
	assert_non_null(strstr(r.errs, "config: OUTBOX_CE_SOURCE_FILE: "
				       "'/dev/null' is a device"));
	run_free(&r);

	/* Readable by everyone: loaded, and one warning naming the file. */
	env_clear();
	temp_text("outbox_events\n", path, sizeof(path));
	assert_int_equal(chmod(path, 0644), 0);
	env_set("OUTBOX_TABLE_FILE", path);
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_string_equal(r.cfg.table, "outbox_events");
	assert_non_null(strstr(r.cfg.warnings, "OUTBOX_TABLE_FILE: '"));
	assert_non_null(
	    strstr(r.cfg.warnings, "' is readable by every user (mode 0644)"));
	assert_non_null(strchr(r.cfg.warnings, '\n'));
	run_free(&r);

	/* Readable by its owner and group only: no warning. */
	assert_int_equal(chmod(path, 0640), 0);
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_string_equal(r.cfg.warnings, "");
	run_free(&r);

	unlink(path);
	unlink(fifo);
	rmdir(dir);
	env_clear();
}

#define HIDDEN "Zq9HiddenPw"

static void test_secrets_hidden(void **state)
{
	char path[256];
	const char *p;
	struct run r;
	int hidden = 0;

	(void)state;
	env_set("OUTBOX_DATABASE_URL",
		"postgres://u:" HIDDEN "@db/app?bogus=1");
	env_set("OUTBOX_LISTEN_DATABASE_URL",
		"host=db password=" HIDDEN " bogus=1");
	env_set("OUTBOX_AMQP_URL", "http://u:" HIDDEN "@rabbit/");
	run_load(&r);
	assert_int_equal(r.problems, 3);
	assert_null(strstr(r.errs, HIDDEN));
	for (p = r.errs; (p = strstr(p, "(value hidden)")); p++)
		hidden++;
	assert_int_equal(hidden, 3);
	run_free(&r);

	/* A secret read from a file is hidden too. */
	env_clear();
	temp_text("amqp://u:" HIDDEN "@h:bad/vh\n", path, sizeof(path));
	env_set("OUTBOX_AMQP_URL_FILE", path);
	run_load(&r);
	assert_int_equal(r.problems, 1);
	assert_non_null(strstr(r.errs, "config: OUTBOX_AMQP_URL: "));
	assert_null(strstr(r.errs, HIDDEN));
	run_free(&r);
	unlink(path);
}

struct cross_case {
	const char *env[5][2];
	int problems;
	const char *needle[2];
};

static const struct cross_case cross_cases[] = {
    {{{"OUTBOX_PUBLISH_TIMEOUT", "50s"}, {"OUTBOX_SHUTDOWN_TIMEOUT", "2m"}},
     1,
     {"config: OUTBOX_PUBLISH_TIMEOUT: publish timeout 50s plus "
      "OUTBOX_STATEMENT_TIMEOUT 10s (the mark budget) must be less than "
      "OUTBOX_LEASE_TIMEOUT 1m\n"}},
    {{{"OUTBOX_PUBLISH_TIMEOUT", "49s"}, {"OUTBOX_SHUTDOWN_TIMEOUT", "2m"}},
     0,
     {NULL}},
    {{{"OUTBOX_STATEMENT_TIMEOUT", "55s"}, {"OUTBOX_SHUTDOWN_TIMEOUT", "2m"}},
     1,
     {"config: OUTBOX_PUBLISH_TIMEOUT: "}},
    {{{"OUTBOX_LEASE_TIMEOUT", "15s"}},
     2,
     {"config: OUTBOX_PUBLISH_TIMEOUT: ",
      "config: OUTBOX_SWEEP_INTERVAL: sweep interval 30s must be less "
      "than OUTBOX_LEASE_TIMEOUT 15s\n"}},
    {{{"OUTBOX_LEASE_TIMEOUT", "16s"}, {"OUTBOX_SWEEP_INTERVAL", "15s"}},
     0,
     {NULL}},
    {{{"OUTBOX_SWEEP_INTERVAL", "1m"}}, 1, {"config: OUTBOX_SWEEP_INTERVAL: "}},
    {{{"OUTBOX_BACKOFF_BASE", "6m"}},
     1,
     {"config: OUTBOX_BACKOFF_BASE: backoff base 6m must not exceed "
      "OUTBOX_BACKOFF_MAX 5m\n"}},
    {{{"OUTBOX_BACKOFF_BASE", "5m"}}, 0, {NULL}},
    {{{"OUTBOX_WORKERS", "16"}, {"OUTBOX_WORKER_WINDOW", "5"}},
     1,
     {"config: OUTBOX_WORKER_WINDOW: OUTBOX_WORKERS 16 times a window of 5 "
      "is 80 lanes"}},
    {{{"OUTBOX_WORKERS", "64"}}, 0, {NULL}},
    {{{"OUTBOX_WORKERS", "16"}, {"OUTBOX_WORKER_WINDOW", "4"}}, 0, {NULL}},
    {{{"OUTBOX_SHUTDOWN_TIMEOUT", "10s"}},
     1,
     {"config: OUTBOX_SHUTDOWN_TIMEOUT: shutdown timeout 10s must be "
      "greater than OUTBOX_PUBLISH_TIMEOUT 5s plus OUTBOX_STATEMENT_TIMEOUT "
      "10s"}},
    {{{"OUTBOX_SHUTDOWN_TIMEOUT", "15s"}},
     1,
     {"config: OUTBOX_SHUTDOWN_TIMEOUT: shutdown timeout 15s must be "
      "greater than OUTBOX_PUBLISH_TIMEOUT 5s plus"}},
    {{{"OUTBOX_SHUTDOWN_TIMEOUT", "16s"}}, 0, {NULL}},
    {{{"OUTBOX_PUBLISH_TIMEOUT", "40s"}, {"OUTBOX_LEASE_TIMEOUT", "1m"}},
     1,
     {"config: OUTBOX_SHUTDOWN_TIMEOUT: shutdown timeout 25s must be "
      "greater than OUTBOX_PUBLISH_TIMEOUT 40s plus"}},
    {{{"OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS", "5001"}},
     1,
     {"config: OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS: message.timeout.ms must "
      "not exceed OUTBOX_PUBLISH_TIMEOUT (5s = 5000 ms)"}},
    {{{"OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS", "5000"}}, 0, {NULL}},
    {{{"OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS", "0"}},
     1,
     {"config: OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS: message.timeout.ms must be "
      "a positive"}},
    {{{"OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS", "soon"}},
     1,
     {"config: OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS: "}},
    {{{"OUTBOX_KAFKA_DELIVERY_TIMEOUT_MS", "300000"}},
     1,
     {"config: OUTBOX_KAFKA_DELIVERY_TIMEOUT_MS: delivery.timeout.ms "}},
    {{{"OUTBOX_PUBLISH_TIMEOUT", "30s"},
      {"OUTBOX_SHUTDOWN_TIMEOUT", "1m"},
      {"OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS", "30000"}},
     0,
     {NULL}},
    /* A value that failed to parse is not cross-checked again. */
    {{{"OUTBOX_PUBLISH_TIMEOUT", "50s"},
      {"OUTBOX_SHUTDOWN_TIMEOUT", "2m"},
      {"OUTBOX_LEASE_TIMEOUT", "soon"}},
     1,
     {"config: OUTBOX_LEASE_TIMEOUT: not a duration"}},
    /* Every problem is reported, not just the first. */
    {{{"OUTBOX_PUBLISH_TIMEOUT", "50s"},
      {"OUTBOX_SWEEP_INTERVAL", "1m"},
      {"OUTBOX_BACKOFF_BASE", "6m"},
      {"OUTBOX_SHUTDOWN_TIMEOUT", "10s"},
      {"OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS", "60000"}},
     5,
     {"config: OUTBOX_SHUTDOWN_TIMEOUT: ",
      "config: OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS: "}},
};

static void test_cross_checks(void **state)
{
	(void)state;
	for (size_t n = 0; n < ARRAY_SIZE(cross_cases); n++) {
		const struct cross_case *c = &cross_cases[n];
		struct run r;

		env_clear();
		for (size_t i = 0; i < 5 && c->env[i][0]; i++)
			env_set(c->env[i][0], c->env[i][1]);
		run_load(&r);
		if (r.problems != c->problems)
			fail_msg("case %zu: want %d problems, got %d:\n%s", n,
				 c->problems, r.problems, r.errs);
		for (size_t i = 0; i < 2 && c->needle[i]; i++)
			if (!strstr(r.errs, c->needle[i]))
				fail_msg("case %zu: missing '%s' in:\n%s", n,
					 c->needle[i], r.errs);
		run_free(&r);
	}
}

/* OUTBOX_WORKER_WINDOW=0 (the default) keeps a replica at two batches in
 * flight: two lanes for one worker, one per worker for several. */
static void test_worker_window(void **state)
{
	(void)state;
	static const struct {
		const char *workers, *window;
		int lanes;
	} cases[] = {
	    {NULL, NULL, 2}, {"1", NULL, 2}, {"4", NULL, 1},
	    {"4", "0", 1},   {"4", "3", 3},  {"1", "1", 1},
	};
	for (size_t n = 0; n < ARRAY_SIZE(cases); n++) {
		struct run r;
		env_clear();
		if (cases[n].workers)
			env_set("OUTBOX_WORKERS", cases[n].workers);
		if (cases[n].window)
			env_set("OUTBOX_WORKER_WINDOW", cases[n].window);
		run_load(&r);
		assert_int_equal(r.problems, 0);
		if (config_worker_window(&r.cfg) != cases[n].lanes)
			fail_msg("case %zu: %d lanes, want %d", n,
				 config_worker_window(&r.cfg), cases[n].lanes);
		run_free(&r);
	}
}

/* The pace after a partial batch: 14 ms unless set. */
static void test_lease_interval(void **state)
{
	(void)state;
	struct run r;
	env_clear();
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_int_equal(r.cfg.lease_interval_ms, 14);
	run_free(&r);
}

/* OUTBOX_TABLE lists the relay's sources; one name is a list of one. */
/* OUTBOX_DATABASES: each database's URL (or its file) and LISTEN URL,
 * and a clear error for each way to get it wrong. */
static void test_databases(void **state)
{
	(void)state;
	struct run r;
	char file[256];

	/* Without it: one database, OUTBOX_DATABASE_URL's. */
	env_clear();
	env_set("OUTBOX_DATABASE_URL", "host=a dbname=one");
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_int_equal(config_n_databases(&r.cfg), 1);
	assert_string_equal(config_database_name(&r.cfg, 0), "");
	assert_string_equal(config_database_url(&r.cfg, 0),
			    "host=a dbname=one");
	assert_null(config_listen_url(&r.cfg, 0));
	char var[64];
	config_database_setting(&r.cfg, 0, "OUTBOX_LISTEN_DATABASE_URL", var,
				sizeof(var));
	assert_string_equal(var, "OUTBOX_LISTEN_DATABASE_URL");
	run_free(&r);

	env_clear();
	temp_text("host=b dbname=two\n", file, sizeof(file));
	env_set("OUTBOX_DATABASES", "shard_1, shard2");
	env_set("OUTBOX_DATABASE_URL_SHARD_1", "host=a dbname=one");
	env_set("OUTBOX_DATABASE_URL_SHARD2_FILE", file);
	env_set("OUTBOX_LISTEN_DATABASE_URL_SHARD2", "host=direct dbname=two");
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_int_equal(config_n_databases(&r.cfg), 2);
	assert_string_equal(config_database_name(&r.cfg, 1), "shard2");
	assert_string_equal(config_database_url(&r.cfg, 0),
			    "host=a dbname=one");
	assert_string_equal(config_database_url(&r.cfg, 1),
			    "host=b dbname=two");
	assert_null(config_listen_url(&r.cfg, 0));
	assert_string_equal(config_listen_url(&r.cfg, 1),
			    "host=direct dbname=two");
	assert_int_equal(config_database_index(&r.cfg, "shard2", 6), 1);
	assert_int_equal(config_database_index(&r.cfg, "shard", 5), -1);
	/* The variable an error names for that database. */
	config_database_setting(&r.cfg, 0, "OUTBOX_LISTEN_DATABASE_URL", var,
				sizeof(var));
	assert_string_equal(var, "OUTBOX_LISTEN_DATABASE_URL_SHARD_1");
	run_free(&r);
	unlink(file);

	static const struct {
		const char *list, *why;
	} bad[] = {
	    {"one", "names at least two databases"},
	    {"a,b,a", "database a is listed twice"},
	    {"a,B", "database 2 of the list: a name is lower-case"},
	    {"a,,b", "an empty database name in the list"},
	    {"a,file", "file is not a name"},
	    {"a,audit_file", "a name ending in _file is not one"},
	    {"a,b/c", "database 2 of the list"},
	};
	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		env_clear();
		env_set("OUTBOX_DATABASES", bad[i].list);
		run_load(&r);
		assert_int_equal(r.problems, 1);
		if (!strstr(r.errs, bad[i].why))
			fail_msg("%s: %s", bad[i].list, r.errs);
		run_free(&r);
	}

	/* A database without its URL, the one-database URL beside the
	 * list, and a URL for a database not listed: each said, the URL
	 * never printed. */
	env_clear();
	env_set("OUTBOX_DATABASES", "a,b");
	env_set("OUTBOX_DATABASE_URL", "host=secret1");
	env_set("OUTBOX_DATABASE_URL_A", "host=secret2");
	env_set("OUTBOX_DATABASE_URL_C", "host=secret3");
	run_load(&r);
	assert_int_equal(r.problems, 3);
	assert_non_null(strstr(r.errs, "config: OUTBOX_DATABASE_URL_B: not "
				       "set: database b of OUTBOX_DATABASES"));
	assert_non_null(strstr(r.errs, "config: OUTBOX_DATABASE_URL: set with "
				       "OUTBOX_DATABASES"));
	assert_non_null(strstr(r.errs, "config: OUTBOX_DATABASE_URL_C: names "
				       "no database of OUTBOX_DATABASES"));
	assert_null(strstr(r.errs, "secret"));
	run_free(&r);

	/* A URL refused, and a list refused: each said once, not also as a
	 * URL missing or a URL naming no database of an unset list. */
	env_clear();
	env_set("OUTBOX_DATABASES", "a,b");
	env_set("OUTBOX_DATABASE_URL_A", "host=a bogus=1");
	env_set("OUTBOX_DATABASE_URL_B", "host=b");
	run_load(&r);
	if (r.problems != 1 || !strstr(r.errs, "OUTBOX_DATABASE_URL_A: "))
		fail_msg("a URL refused: %s", r.errs);
	run_free(&r);
	env_clear();
	env_set("OUTBOX_DATABASES", "one");
	env_set("OUTBOX_DATABASE_URL_ONE", "host=a");
	run_load(&r);
	if (r.problems != 1 || !strstr(r.errs, "names at least two"))
		fail_msg("a list refused: %s", r.errs);
	run_free(&r);

	/* A per-database URL without the list is not silently unused. */
	env_clear();
	env_set("OUTBOX_LISTEN_DATABASE_URL_X", "host=x");
	run_load(&r);
	assert_int_equal(r.problems, 1);
	assert_non_null(strstr(r.errs, "OUTBOX_DATABASES is not set"));
	run_free(&r);

	assert_true(config_knows(&ext, "OUTBOX_DATABASE_URL_SHARD2"));
	assert_true(config_knows(&ext, "OUTBOX_DATABASE_URL_SHARD2_FILE"));
	assert_true(config_knows(&ext, "OUTBOX_LISTEN_DATABASE_URL_SHARD2"));
	assert_false(config_knows(&ext, "OUTBOX_DATABASE_URLX"));
}

static void test_table_list(void **state)
{
	(void)state;
	struct run r;
	env_clear();
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_int_equal(r.cfg.n_tables, 1);
	assert_string_equal(r.cfg.tables[0], "outbox_events");
	run_free(&r);

	env_clear();
	env_set("OUTBOX_TABLE", " t1.outbox_events,t2.outbox_events , orders ");
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_int_equal(r.cfg.n_tables, 3);
	assert_string_equal(r.cfg.tables[0], "t1.outbox_events");
	assert_string_equal(r.cfg.tables[1], "t2.outbox_events");
	assert_string_equal(r.cfg.tables[2], "orders");
	assert_string_equal(r.cfg.warnings, "");
	run_free(&r);

	/* Upper case is taken as written (as quoted), which SQL's unquoted
	 * name is not: said, naming the table SQL would mean. */
	env_clear();
	env_set("OUTBOX_TABLE", "Orders.Outbox_Events,b");
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_string_equal(r.cfg.tables[0], "Orders.Outbox_Events");
	assert_non_null(strstr(r.cfg.warnings,
			       "OUTBOX_TABLE: 'Orders.Outbox_Events' is taken "
			       "as written, upper case and all"));
	assert_non_null(strstr(r.cfg.warnings, "is orders.outbox_events\n"));
	run_free(&r);

	/* The message says which item is wrong. */
	env_clear();
	env_set("OUTBOX_TABLE", "a, b, a");
	run_load(&r);
	assert_int_equal(r.problems, 1);
	assert_non_null(strstr(r.errs, "table a is listed twice"));
	run_free(&r);
	env_clear();
	env_set("OUTBOX_TABLE", "a,b-c");
	run_load(&r);
	assert_non_null(strstr(r.errs, "table 2 of the list"));
	run_free(&r);

	/* A pattern: a schema glob and a table name. */
	env_clear();
	env_set("OUTBOX_TABLE", "tenant_*.outbox_events,billing.outbox");
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_true(config_has_patterns(&r.cfg));
	assert_string_equal(config_first_table(&r.cfg), "billing.outbox");
	run_free(&r);
	char like[64], name[64], why[256];
	assert_int_equal(table_pattern_parse("tenant_*.outbox_events", like,
					     sizeof(like), name, sizeof(name),
					     why, sizeof(why)),
			 0);
	assert_string_equal(like, "tenant\\_%");
	assert_string_equal(name, "outbox_events");
	assert_true(table_pattern_match("tenant_*.outbox_events",
					"tenant_42.outbox_events"));
	assert_true(table_pattern_match("*.o", "a.o"));
	assert_false(table_pattern_match("tenant_*.outbox_events",
					 "tenantx42.outbox_events"));
	assert_false(
	    table_pattern_match("tenant_*.outbox_events", "tenant_42.outbox"));
	/* Bare: the search_path's table (discovery leaves a pattern's match
	 * of it to the listed source). */
	assert_true(table_is_bare("outbox_events"));
	assert_false(table_is_bare("public.outbox_events"));
	assert_false(table_is_bare("*.outbox_events"));
	assert_false(table_is_bare("1bad"));
}

static void test_kafka_passthrough(void **state)
{
	char pem[256], topic[256];
	struct run r;

	(void)state;
	temp_text("-----BEGIN PRIVATE KEY-----\n", pem, sizeof(pem));
	temp_text("orders\n", topic, sizeof(topic));
	env_set("OUTBOX_KAFKA_SASL_MECHANISM", "PLAIN");
	env_set("OUTBOX_KAFKA_SECURITY_PROTOCOL", "sasl_ssl");
	env_set("OUTBOX_KAFKA_SASL_PASSWORD", "pw");
	env_set("OUTBOX_KAFKA_SSL_KEY_PEM_FILE", pem);
	env_set("OUTBOX_KAFKA_BROKERS", "b1:9092");
	env_set("OUTBOX_KAFKA_TOPIC_FILE", topic);
	env_set("OUTBOX_KAFKA_KEY_FROM", "routing_key");
	env_set("OUTBOX_KAFKA_ENABLE_IDEMPOTENCE", "true");
	env_set("OUTBOX_KAFKA_ACKS", "all");
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_string_equal(KS(r)->brokers, "b1:9092");
	assert_string_equal(KS(r)->topic, "orders");
	assert_int_equal(KS(r)->key_from, KEY_FROM_ROUTING_KEY);
	assert_int_equal(KS(r)->n_props, 6);
	/* Sorted by name. */
	assert_string_equal(KS(r)->props[0].name, "acks");
	assert_string_equal(KS(r)->props[1].name, "enable.idempotence");
	assert_string_equal(KS(r)->props[2].name, "sasl.mechanism");
	assert_string_equal(KS(r)->props[2].value, "PLAIN");
	assert_false(KS(r)->props[2].secret);
	assert_string_equal(KS(r)->props[3].name, "sasl.password");
	assert_string_equal(KS(r)->props[3].value, "pw");
	assert_true(KS(r)->props[3].secret);
	assert_string_equal(KS(r)->props[4].name, "security.protocol");
	assert_string_equal(KS(r)->props[5].name, "ssl.key.pem");
	assert_string_equal(KS(r)->props[5].value,
			    "-----BEGIN PRIVATE KEY-----");
	assert_true(KS(r)->props[5].secret);
	assert_null(kafka_prop_find(&r.cfg, "brokers"));
	assert_null(kafka_prop_find(&r.cfg, "topic"));
	assert_null(kafka_prop_find(&r.cfg, "key.from"));
	run_free(&r);
	unlink(pem);
	unlink(topic);
}

static void test_kafka_secret_names(void **state)
{
	static const struct {
		const char *var, *prop;
		bool secret;
	} cases[] = {
	    {"OUTBOX_KAFKA_SASL_PASSWORD", "sasl.password", true},
	    {"OUTBOX_KAFKA_SSL_KEY_PASSWORD", "ssl.key.password", true},
	    {"OUTBOX_KAFKA_SSL_KEYSTORE_PASSWORD", "ssl.keystore.password",
	     true},
	    {"OUTBOX_KAFKA_SSL_KEY_PEM", "ssl.key.pem", true},
	    {"OUTBOX_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET",
	     "sasl.oauthbearer.client.secret", true},
	    {"OUTBOX_KAFKA_SASL_OAUTHBEARER_CONFIG", "sasl.oauthbearer.config",
	     true},
	    {"OUTBOX_KAFKA_SASL_USERNAME", "sasl.username", false},
	    {"OUTBOX_KAFKA_SSL_KEY_LOCATION", "ssl.key.location", false},
	    {"OUTBOX_KAFKA_CLIENT_ID", "client.id", false},
	    {"OUTBOX_KAFKA_COMPRESSION_TYPE", "compression.type", false},
	};
	struct run r;

	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
		env_set(cases[i].var, "v");
	run_load(&r);
	assert_int_equal(r.problems, 0);
	assert_int_equal(KS(r)->n_props, ARRAY_SIZE(cases));
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		const struct kafka_prop *p =
		    kafka_prop_find(&r.cfg, cases[i].prop);
		if (!p || p->secret != cases[i].secret)
			fail_msg("%s: missing or secret=%d", cases[i].prop,
				 p ? p->secret : -1);
	}
	run_free(&r);
}

struct kafka_bad_case {
	const char *env[2][2];
	const char *needle; /* NULL: accepted */
};

static const struct kafka_bad_case kafka_bad_cases[] = {
    {{{"OUTBOX_KAFKA_ENABLE_IDEMPOTENCE", "false"}},
     "config: OUTBOX_KAFKA_ENABLE_IDEMPOTENCE: the relay requires "
     "enable.idempotence=true"},
    {{{"OUTBOX_KAFKA_ENABLE_IDEMPOTENCE", "true"}}, NULL},
    {{{"OUTBOX_KAFKA_ACKS", "1"}},
     "config: OUTBOX_KAFKA_ACKS: the relay requires acks=all"},
    {{{"OUTBOX_KAFKA_ACKS", "all"}}, NULL},
    {{{"OUTBOX_KAFKA_ACKS", "-1"}}, NULL},
    {{{"OUTBOX_KAFKA_REQUEST_REQUIRED_ACKS", "0"}},
     "config: OUTBOX_KAFKA_REQUEST_REQUIRED_ACKS: the relay requires "
     "request.required.acks=all"},
    {{{"OUTBOX_KAFKA_BOOTSTRAP_SERVERS", "b:9092"}},
     "config: OUTBOX_KAFKA_BOOTSTRAP_SERVERS: set the brokers with "
     "OUTBOX_KAFKA_BROKERS"},
    {{{"OUTBOX_KAFKA_", "x"}}, "config: OUTBOX_KAFKA_: not a librdkafka"},
    {{{"OUTBOX_KAFKA_A__B", "x"}},
     "config: OUTBOX_KAFKA_A__B: not a librdkafka"},
    {{{"OUTBOX_KAFKA_A_", "x"}}, "config: OUTBOX_KAFKA_A_: not a librdkafka"},
    {{{"OUTBOX_KAFKA_A-B", "x"}}, "config: OUTBOX_KAFKA_A-B: not a librdkafka"},
    {{{"OUTBOX_KAFKA_SASL_MECHANISM", "PLAIN"},
      {"OUTBOX_KAFKA_sasl_mechanism", "PLAIN"}},
     "property 'sasl.mechanism' is set by more than one variable"},
    {{{"OUTBOX_KAFKA_SASL_PASSWORD", "a"},
      {"OUTBOX_KAFKA_SASL_PASSWORD_FILE", "b"}},
     "config: OUTBOX_KAFKA_SASL_PASSWORD: both OUTBOX_KAFKA_SASL_PASSWORD "
     "and OUTBOX_KAFKA_SASL_PASSWORD_FILE are set"},
    {{{"OUTBOX_KAFKA_BROKERS", "a:1"}, {"OUTBOX_KAFKA_BROKERS_FILE", "b"}},
     "config: OUTBOX_KAFKA_BROKERS: both"},
};

static void test_kafka_refused(void **state)
{
	(void)state;
	for (size_t n = 0; n < ARRAY_SIZE(kafka_bad_cases); n++) {
		const struct kafka_bad_case *c = &kafka_bad_cases[n];
		struct run r;

		env_clear();
		for (size_t i = 0; i < 2 && c->env[i][0]; i++)
			env_set(c->env[i][0], c->env[i][1]);
		run_load(&r);
		if (c->needle ? r.problems != 1 || !strstr(r.errs, c->needle)
			      : r.problems != 0)
			fail_msg("case %zu (%s): %d problems:\n%s", n,
				 c->env[0][0], r.problems, r.errs);
		run_free(&r);
	}
}

struct redact_case {
	const char *in, *out;
};

static const struct redact_case redact_cases[] = {
    {"postgres://user:pass@host/db", "postgres://user:***@host/db"},
    {"postgresql://user@host/db", "postgresql://user@host/db"},
    {"postgresql://host:5432/db", "postgresql://host:5432/db"},
    {"amqp://u:p@h:5672/vh", "amqp://u:***@h:5672/vh"},
    {"amqps://guest:s3cr3t@rabbit", "amqps://guest:***@rabbit"},
    {"postgres://:pw@host", "postgres://:***@host"},
    {"postgres://u:p@ss@host/db", "postgres://u:***@host/db"},
    {"postgres://u:a/b?c@host/db", "postgres://u:***@host/db"},
    {"postgresql://admin:/S3cret@db.example.com/app",
     "postgresql://admin:***@db.example.com/app"},
    {"postgresql://u:S3cr@et@host/db", "postgresql://u:***@host/db"},
    {"postgresql://u:S3cr%40et%3A%2F%25@host/db", "postgresql://u:***@host/db"},
    {"postgresql://u:a:b@host/db", "postgresql://u:***@host/db"},
    {"postgresql://u:a?b@host/db", "postgresql://u:***@host/db"},
    /* an '@' in the query is not the end of a password */
    {"postgresql://host:5432/db?application_name=a@b",
     "postgresql://host:5432/db?application_name=a@b"},
    {"postgresql://u:pw@h1:5432,h2/db?application_name=a@b",
     "postgresql://u:***@h1:5432,h2/db?application_name=a@b"},
    {"postgres://host/db?user=x&password=secret&sslmode=require",
     "postgres://host/db?user=x&password=***&sslmode=require"},
    {"postgres://host/db?password=ab#cd&x=1",
     "postgres://host/db?password=***&x=1"},
    /* libpq decodes a query key: this one sets the password */
    {"postgresql://relay@db/app?pass%77ord=hunter2&sslmode=require",
     "postgresql://relay@db/app?pass%77ord=***&sslmode=require"},
    {"postgresql://db/app?%70%61%73%73%57%4f%52%44=x",
     "postgresql://db/app?%70%61%73%73%57%4f%52%44=***"},
    {"postgresql://db/app?app%5Fname=a%2",
     "postgresql://db/app?app%5Fname=a%2"},
    {"postgresql://u:p@h1:5432,h2:5433/db?target_session_attrs=read-write",
     "postgresql://u:***@h1:5432,h2:5433/db?target_session_attrs=read-"
     "write"},
    {"host=x password=secret dbname=y", "host=x password=*** dbname=y"},
    {"host=x password = 'a b\\' c' dbname=y", "host=x password = *** dbname=y"},
    {"password=a\\ b host=x", "password=*** host=x"},
    {"PASSWORD=abc host=x", "PASSWORD=*** host=x"},
    {"sslpassword=k host=x", "sslpassword=*** host=x"},
    {"host=x password=ab://c@d", "host=x password=***"},
    {"host=localhost", "host=localhost"},
    {"", ""},
    {"://", "://"},
    {"@", "@"},
    {"=", "="},
    {"password=", "password=***"},
    {"password='unterminated", "password=***"},
    {"password='trailing\\", "password=***"},
    {"a\\", "a\\"},
    {"x://:@", "x://:***@"},
    {"amqp://u:p@", "amqp://u:***@"},
    {"amqp://", "amqp://"},
};

static void test_redact_url(void **state)
{
	char out[256], small[12];

	(void)state;
	for (size_t n = 0; n < ARRAY_SIZE(redact_cases); n++) {
		config_redact_url(redact_cases[n].in, out, sizeof(out));
		if (strcmp(out, redact_cases[n].out) != 0)
			fail_msg("redact '%s': got '%s', want '%s'",
				 redact_cases[n].in, out, redact_cases[n].out);
	}

	config_redact_url(NULL, out, sizeof(out));
	assert_string_equal(out, "");

	/* Truncated output is terminated and still never holds the secret. */
	memset(small, 'X', sizeof(small));
	config_redact_url("postgres://user:pass@host/db", small, sizeof(small));
	assert_string_equal(small, "postgres://");
	config_redact_url("postgres://u:pass@host/db", small, sizeof(small));
	assert_string_equal(small, "postgres://");
	config_redact_url("postgres://u:pass@host/db", small, 1);
	assert_string_equal(small, "");
	small[0] = 'X';
	config_redact_url("postgres://u:pass@host/db", small, 0);
	assert_int_equal(small[0], 'X');
	config_redact_url("host=x password=secret", small, sizeof(small));
	assert_string_equal(small, "host=x pass");
}

struct userinfo_case {
	const char *url;
	const char *why; /* NULL: accepted; else a part of the reason */
};

static const struct userinfo_case userinfo_cases[] = {
    {"postgresql://u:S3cr%40et@host/db", NULL},
    {"postgresql://u:a:b@host:5432/db", NULL},
    {"postgresql://u:p%25@[::1]:5432,h2:5433/db?x=a@b", NULL},
    {"postgresql://host/my%40db", NULL},
    {"postgresql://host:5432/db?application_name=a@b", NULL},
    {"postgresql:///db?host=/tmp", NULL},
    {"host=x password=a@b/c%", NULL},
    {"amqp://u:p@h:5672/vh", NULL},
    {"postgresql://u:S3cr@et@host/db", "more than one '@'"},
    {"postgresql://u:S3cr@et@host/db", "%40"},
    {"postgresql://u:a/b@host/db", "a '/' before the '@'"},
    /* A password starting with '/' (or digits and a '/') reads as a
     * host, a port and a database holding the rest: refused. */
    {"postgresql://admin:/S3cret@db.example.com/app", "%2F"},
    {"postgresql://postgres:2024/S3cret@db/app", "%2F"},
    {"postgresql://host/my@db", "%40"},
    {"postgresql://u:a/b?c@host/db", "%2F"},
    {"postgresql://u:50%@host/db", "write '%' as %25"},
    {"postgresql://u:5%zz@host/db", "two hex digits"},
    {"postgresql://u:a?b@host/db", "%3F"},
    {"postgresql://host?application_name=a@b", "after a '?'"},
    {"amqp://u:S3cr@et@host/vh", "more than one '@'"},
};

static void test_url_userinfo_check(void **state)
{
	(void)state;
	for (size_t n = 0; n < ARRAY_SIZE(userinfo_cases); n++) {
		const struct userinfo_case *c = &userinfo_cases[n];
		char why[256] = "";
		int rc = config_url_userinfo_check(c->url, why, sizeof(why));

		if (c->why ? rc != -1 || !strstr(why, c->why) : rc != 0)
			fail_msg("check '%s': got %d '%s', want %s", c->url, rc,
				 why, c->why ? c->why : "ok");
		/* The reason never quotes the URL: no part of the password. */
		if (c->why && (strstr(why, "S3cr") || strstr(why, "et@")))
			fail_msg("check '%s' quotes it: '%s'", c->url, why);
	}
}

static char *capture(void (*print)(FILE *, const struct config_extensions *))
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	print(f, &ext);
	assert_int_equal(fclose(f), 0);
	return buf;
}

static void test_help(void **state)
{
	char *help = capture(config_print_help);
	char want[128];

	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(all_vars); i++) {
		snprintf(want, sizeof(want), "\n  %s (default: ", all_vars[i]);
		if (!strstr(help, want))
			fail_msg("--help misses %s", all_vars[i]);
	}
	assert_non_null(strstr(help, "  OUTBOX_BATCH_SIZE (default: 100)\n"));
	assert_non_null(strstr(help, "[1..10000]"));
	assert_non_null(strstr(help, "  OUTBOX_DATABASE_URL (default: unset, "
				     "secret)\n"));
	assert_non_null(strstr(help, "  OUTBOX_FAILED_RETENTION (default: "
				     "7d)\n"));
	assert_non_null(strstr(help, "[0 or 1m..3650d]"));
	assert_non_null(strstr(help, "[one of: binary, structured]"));
	assert_non_null(
	    strstr(help, "publisher backend: stdout, amqp or kafka"));
	assert_non_null(strstr(help, "NAME_FILE"));
	assert_non_null(strstr(help, "OUTBOX_KAFKA_<PROPERTY>"));
	free(help);
}

static void test_markdown(void **state)
{
	static const char head[] =
	    "| Variable | Default | Meaning |\n|---|---|---|\n";
	char *md = capture(config_print_markdown);
	const char *p, *nl;
	char want[128];
	int rows = 0;

	(void)state;
	assert_true(strncmp(md, head, strlen(head)) == 0);
	for (size_t i = 0; i < ARRAY_SIZE(all_vars); i++) {
		snprintf(want, sizeof(want), "\n| `%s` | ", all_vars[i]);
		if (!strstr(md, want))
			fail_msg("markdown misses %s", all_vars[i]);
	}
	assert_non_null(strstr(md, "| `OUTBOX_BATCH_SIZE` | `100` | "));
	assert_non_null(strstr(md, "| `OUTBOX_AMQP_EXCHANGE` | `\"\"` | "));
	assert_non_null(strstr(md, "| `OUTBOX_DATABASE_URL` | unset | "));
	assert_non_null(strstr(md, "| `OUTBOX_KAFKA_<PROPERTY>` | "));
	assert_non_null(strstr(md, "| `OUTBOX_DATABASE_URL_<NAME>` | "));
	/* Two header lines, one row per variable, two for the databases'
	 * variables, one for the passthrough, and every line a well-formed
	 * table row. */
	for (p = md; (nl = strchr(p, '\n')); p = nl + 1) {
		assert_int_equal(p[0], '|');
		assert_int_equal(nl[-1], '|');
		rows++;
	}
	assert_int_equal(*p, '\0');
	assert_int_equal(rows, 2 + (int)ARRAY_SIZE(all_vars) + 2 + 1);
	free(md);
}

static void test_knows(void **state)
{
	char name[128];

	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(all_vars); i++) {
		assert_true(config_knows(&ext, all_vars[i]));
		snprintf(name, sizeof(name), "%s_FILE", all_vars[i]);
		assert_true(config_knows(&ext, name));
	}
	assert_true(config_knows(&ext, "OUTBOX_KAFKA_SASL_MECHANISM"));
	assert_true(config_knows(&ext, "OUTBOX_KAFKA_SASL_PASSWORD_FILE"));
	assert_false(config_knows(&ext, "OUTBOX_TABEL"));
	assert_false(config_knows(&ext, "OUTBOX_TABLE_FILE_FILE"));
	assert_false(config_knows(&ext, "OUTBOX_TABLEX"));
	assert_false(config_knows(&ext, "OUTBOX_TABL"));
	assert_false(config_knows(&ext, "OUTBOX_KAFKA_"));
	assert_false(config_knows(&ext, "OUTBOX_KAFKA__FILE"));
	assert_false(config_knows(&ext, "OUTBOX_"));
	assert_false(config_knows(&ext, "_FILE"));
	assert_false(config_knows(&ext, ""));
	assert_false(config_knows(&ext, NULL));
}

static void test_release(void **state)
{
	static const struct config zero;
	struct config cfg;
	struct run r;

	(void)state;
	memset(&cfg, 0, sizeof(cfg));
	config_release(&cfg);
	assert_memory_equal(&cfg, &zero, sizeof(cfg));

	/* After a failed load with strings and Kafka properties stored. */
	env_set("OUTBOX_DATABASE_URL", "host=db");
	env_set("OUTBOX_KAFKA_CLIENT_ID", "relay");
	env_set("OUTBOX_WORKERS", "0");
	run_load(&r);
	assert_int_equal(r.problems, 1);
	assert_string_equal(r.cfg.database_url, "host=db");
	assert_int_equal(KS(r)->n_props, 1);
	config_release(&r.cfg);
	assert_memory_equal(&r.cfg, &zero, sizeof(r.cfg));
	config_release(&r.cfg);
	assert_memory_equal(&r.cfg, &zero, sizeof(r.cfg));
	free(r.errs);

	/* A NULL error stream still counts problems. */
	assert_int_equal(config_load(&cfg, &ext, NULL), 1);
	config_release(&cfg);
}

int main(void)
{
	publisher_config_extensions(&ext);
	ext.check_conninfo = store_conninfo_check; /* as main.c does */
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_good_values, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_values, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_value_escaped, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_durations, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_duration_messages, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_file_values, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_file_problems, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_file_not_regular, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_secrets_hidden, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_cross_checks, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_worker_window, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_table_list, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_databases, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_lease_interval, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_kafka_passthrough, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_kafka_secret_names, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_kafka_refused, setup,
					    teardown),
	    cmocka_unit_test(test_redact_url),
	    cmocka_unit_test(test_url_userinfo_check),
	    cmocka_unit_test(test_help),
	    cmocka_unit_test(test_markdown),
	    cmocka_unit_test(test_knows),
	    cmocka_unit_test_setup_teardown(test_release, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
