/* SPDX-License-Identifier: MIT */
/*
 * Settings from the environment. One table (settings[] below) drives
 * parsing, defaults, validation, --help, the README table and
 * config_knows(); the Kafka passthrough and the cross-checks of the
 * contract's section 4 follow it.
 */
#include "config.h"
#include "publishers/publisher.h"

#include "base/base.h"

#include <amqp.h>
#include <libpq-fe.h>

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#define SECOND INT64_C(1000)
#define MINUTE (60 * SECOND)
#define HOUR (60 * MINUTE)
#define DAY (24 * HOUR)

/* Secrets and PEM bundles fit; anything larger is a wrong path. */
#define FILE_VALUE_MAX (1024 * 1024)
/* Derived names (name_pending_idx, name_notify, ...) stay within 63. */
#define TABLE_PART_MAX 40
#define KAFKA_PREFIX "OUTBOX_KAFKA_"
#define FILE_SUFFIX "_FILE"

enum setting_type {
	SET_STRING,   /* char *, validated by check() when given */
	SET_WORD,     /* char *, one of choices, stored as that choice */
	SET_ENUM,     /* int-sized enum: index into choices, or lookup() */
	SET_BOOL,     /* bool: on|off|true|false */
	SET_INT,      /* int within [min, max] */
	SET_DOUBLE,   /* double within [min, max] */
	SET_DURATION, /* int64_t milliseconds within [min, max] */
};

enum setting_flags {
	SETTING_SECRET = 1 << 0,   /* the value is never printed */
	SETTING_NULLABLE = 1 << 1, /* unset or empty leaves the field NULL */
	SETTING_ZERO_OK = 1 << 2,  /* 0 is allowed below min and means off */
};

struct setting {
	const char *name;
	enum setting_type type;
	size_t offset;	 /* into struct config */
	const char *def; /* as text; NULL: unset (NULLABLE) or required */
	int64_t min, max;
	const char *const *choices;   /* NULL-terminated */
	int (*lookup)(const char *s); /* SET_ENUM: value, or -1 when unknown */
	int (*check)(const char *value, char *why, size_t whylen);
	unsigned flags;
	const char *help;
};

/*
 * offsetof() that refuses to compile unless the field has the C type the
 * row's parser writes through the offset, so a row can never point a
 * parser at a field of another type.
 */
#define FIELD_IS(f, T) _Generic(((struct config *)0)->f, T : 1, default : 0)
#define FIELD_SIZE(f) sizeof(((struct config *)0)->f)
#define CHECKED(offset, ok) ((offset) + 0 * sizeof(char[(ok) ? 1 : -1]))
#define FIELD(f, T) CHECKED(offsetof(struct config, f), FIELD_IS(f, T))
#define ENUM_FIELD(f)                                                          \
	CHECKED(offsetof(struct config, f), FIELD_SIZE(f) == sizeof(int))

#define STRING(n, f, d, chk, fl, h)                                            \
	{                                                                      \
		.name = n, .type = SET_STRING, .offset = FIELD(f, char *),     \
		.def = d, .check = chk, .flags = fl, .help = h                 \
	}
#define WORD(n, f, d, ch, h)                                                   \
	{                                                                      \
		.name = n, .type = SET_WORD, .offset = FIELD(f, char *),       \
		.def = d, .choices = ch, .help = h                             \
	}
#define ENUM(n, f, d, ch, lk, h)                                               \
	{                                                                      \
		.name = n, .type = SET_ENUM, .offset = ENUM_FIELD(f),          \
		.def = d, .choices = ch, .lookup = lk, .help = h               \
	}
#define BOOL(n, f, d, h)                                                       \
	{                                                                      \
		.name = n, .type = SET_BOOL, .offset = FIELD(f, bool),         \
		.def = d, .help = h                                            \
	}
#define INT(n, f, d, lo, hi, h)                                                \
	{                                                                      \
		.name = n, .type = SET_INT, .offset = FIELD(f, int), .def = d, \
		.min = lo, .max = hi, .help = h                                \
	}
#define DOUBLE(n, f, d, lo, hi, h)                                             \
	{                                                                      \
		.name = n, .type = SET_DOUBLE, .offset = FIELD(f, double),     \
		.def = d, .min = lo, .max = hi, .help = h                      \
	}
#define DURATION(n, f, d, lo, hi, fl, h)                                       \
	{                                                                      \
		.name = n, .type = SET_DURATION, .offset = FIELD(f, int64_t),  \
		.def = d, .min = lo, .max = hi, .flags = fl, .help = h         \
	}

/* SET_ENUM rows store the index of the choice: keep the orders equal. */
_Static_assert(UNROUTABLE_RETRY == 0 && UNROUTABLE_FAIL == 1, "choices");
_Static_assert(KEY_FROM_PARTITION_KEY == 0 && KEY_FROM_ROUTING_KEY == 1,
	       "choices");
_Static_assert(CE_MODE_BINARY == 0 && CE_MODE_STRUCTURED == 1, "choices");
_Static_assert(ORDERING_NONE == 0 && ORDERING_PARTITION == 1, "choices");
_Static_assert(ON_FAILURE_SKIP == 0 && ON_FAILURE_BLOCK == 1, "choices");
_Static_assert(LOG_FORMAT_JSON == 0 && LOG_FORMAT_TEXT == 1, "choices");

static const char *const header_prefix_choices[] = {"ce-", "cloudEvents_",
						    NULL};
static const char *const unroutable_choices[] = {"retry", "fail", NULL};
static const char *const key_from_choices[] = {"partition_key", "routing_key",
					       NULL};
static const char *const ce_mode_choices[] = {"binary", "structured", NULL};
static const char *const ordering_choices[] = {"none", "partition", NULL};
static const char *const on_failure_choices[] = {"skip", "block", NULL};
static const char *const log_level_choices[] = {"debug", "info", "warn",
						"error", NULL};
static const char *const log_format_choices[] = {"json", "text", NULL};

static int check_conninfo(const char *v, char *why, size_t whylen);
static int check_table(const char *v, char *why, size_t whylen);
static int check_amqp_url(const char *v, char *why, size_t whylen);
static int check_exchange(const char *v, char *why, size_t whylen);
static int check_publisher(const char *v, char *why, size_t whylen);
static int check_brokers(const char *v, char *why, size_t whylen);
static int check_topic(const char *v, char *why, size_t whylen);
static int check_ce_source(const char *v, char *why, size_t whylen);
static int check_http_addr(const char *v, char *why, size_t whylen);

static const struct setting settings[] = {
    /* Postgres */
    STRING("OUTBOX_DATABASE_URL", database_url, NULL, check_conninfo,
	   SETTING_SECRET | SETTING_NULLABLE,
	   "Postgres connection URI or key=value string; unset or empty "
	   "uses libpq's PG* variables"),
    STRING("OUTBOX_TABLE", table, "outbox_events", check_table, 0,
	   "outbox table, name or schema.name; each part an SQL "
	   "identifier of at most 40 bytes"),
    BOOL("OUTBOX_LISTEN", listen, "off",
	 "wake workers by LISTEN/NOTIFY (needs the NOTIFY trigger from "
	 "sql/) besides polling"),
    STRING("OUTBOX_LISTEN_DATABASE_URL", listen_database_url, NULL,
	   check_conninfo, SETTING_SECRET | SETTING_NULLABLE,
	   "direct (never pooled) connection for LISTEN; unset or empty "
	   "uses OUTBOX_DATABASE_URL"),
    BOOL("OUTBOX_PG_PREPARE", pg_prepare, "on",
	 "use named prepared statements; off for transaction-mode "
	 "poolers"),
    DURATION("OUTBOX_STATEMENT_TIMEOUT", statement_timeout_ms, "10s", 100, HOUR,
	     0,
	     "Postgres statement_timeout, also the budget for writing a "
	     "batch's outcomes"),

    /* Publisher */
    STRING("OUTBOX_PUBLISHER", publisher, "stdout", check_publisher, 0,
	   "publisher backend: stdout, amqp or kafka"),
    STRING("OUTBOX_AMQP_URL", amqp_url, "amqp://guest:guest@127.0.0.1:5672",
	   check_amqp_url, SETTING_SECRET,
	   "broker URL, amqp://user:password@host:port/vhost or amqps:// "
	   "for TLS; no path means vhost /"),
    STRING("OUTBOX_AMQP_EXCHANGE", amqp_exchange, "", check_exchange, 0,
	   "exchange for rows whose exchange is NULL; empty is the "
	   "default exchange"),
    BOOL("OUTBOX_AMQP_DECLARE_EXCHANGE", amqp_declare_exchange, "off",
	 "declare OUTBOX_AMQP_EXCHANGE when connecting"),
    WORD("OUTBOX_AMQP_HEADER_PREFIX", amqp_header_prefix, "ce-",
	 header_prefix_choices, "prefix of CloudEvents AMQP headers"),
    ENUM("OUTBOX_UNROUTABLE", unroutable, "retry", unroutable_choices, NULL,
	 "what an unroutable (returned) AMQP message does to its row: "
	 "retry pauses the destination, fail fails the row"),
    STRING("OUTBOX_KAFKA_BROKERS", kafka_brokers, "127.0.0.1:9092",
	   check_brokers, 0, "Kafka bootstrap brokers, host:port,..."),
    STRING("OUTBOX_KAFKA_TOPIC", kafka_topic, "outbox", check_topic, 0,
	   "topic for rows whose exchange is NULL"),
    ENUM("OUTBOX_KAFKA_KEY_FROM", kafka_key_from, "partition_key",
	 key_from_choices, NULL, "row column used as the Kafka message key"),

    /* CloudEvents */
    STRING("OUTBOX_CE_SOURCE", ce_source, "/outbox-relay", check_ce_source, 0,
	   "CloudEvents source for rows whose source is NULL"),
    ENUM("OUTBOX_CE_MODE", ce_mode, "binary", ce_mode_choices, NULL,
	 "CloudEvents content mode"),

    /* Loops */
    INT("OUTBOX_BATCH_SIZE", batch_size, "100", 1, 10000,
	"rows leased per batch"),
    INT("OUTBOX_WORKERS", workers, "1", 1, 64,
	"relay worker threads per process"),
    DURATION("OUTBOX_POLL_INTERVAL", poll_interval_ms, "2s", 10, HOUR, 0,
	     "longest idle sleep between polls"),
    DURATION("OUTBOX_PUBLISH_TIMEOUT", publish_timeout_ms, "5s", 100, HOUR, 0,
	     "deadline for the broker to acknowledge a batch"),
    DURATION("OUTBOX_LEASE_TIMEOUT", lease_timeout_ms, "1m", SECOND, DAY, 0,
	     "how long a leased row belongs to its relay; must exceed "
	     "publish timeout plus statement timeout"),
    DURATION("OUTBOX_SWEEP_INTERVAL", sweep_interval_ms, "30s", 100, HOUR, 0,
	     "how often expired leases are returned; must be below the "
	     "lease timeout"),
    DURATION("OUTBOX_CLEAN_INTERVAL", clean_interval_ms, "1h", SECOND, DAY, 0,
	     "how often old sent and failed rows are deleted"),
    INT("OUTBOX_CLEAN_BATCH_SIZE", clean_batch_size, "1000", 1, 100000,
	"rows deleted per cleaner transaction"),
    DURATION("OUTBOX_RETENTION", retention_ms, "24h", MINUTE, 3650 * DAY, 0,
	     "how long sent rows are kept"),
    DURATION("OUTBOX_FAILED_RETENTION", failed_retention_ms, "7d", MINUTE,
	     3650 * DAY, SETTING_ZERO_OK,
	     "how long failed rows are kept; 0 keeps them"),
    DURATION("OUTBOX_BACKOFF_BASE", backoff_base_ms, "2s", 100, DAY, 0,
	     "retry delay after a row's first failed attempt"),
    DURATION("OUTBOX_BACKOFF_MAX", backoff_max_ms, "5m", 100, 7 * DAY, 0,
	     "longest retry delay"),
    DOUBLE("OUTBOX_BACKOFF_FACTOR", backoff_factor, "2", 1, 10,
	   "growth of the retry delay per attempt"),
    ENUM("OUTBOX_ORDERING", ordering, "none", ordering_choices, NULL,
	 "partition delivers rows of one partition_key in seq order"),
    ENUM("OUTBOX_ORDERING_ON_FAILURE", on_failure, "skip", on_failure_choices,
	 NULL,
	 "in partition ordering, whether a failed row lets its key go on "
	 "(skip) or blocks it until resolved (block)"),
    DOUBLE("OUTBOX_MAX_RATE", max_rate, "0", 0, 1000000,
	   "events per second per process, 0 = unlimited"),
    DURATION("OUTBOX_SHUTDOWN_TIMEOUT", shutdown_timeout_ms, "25s", SECOND,
	     HOUR, 0,
	     "graceful shutdown budget; must exceed the statement timeout"),

    /* Operations */
    STRING("OUTBOX_HTTP_ADDR", http_addr, "0.0.0.0:9090", check_http_addr, 0,
	   "host:port for /healthz, /readyz and /metrics ([::] for IPv6); "
	   "empty disables HTTP"),
    ENUM("OUTBOX_LOG_LEVEL", log_level, "info", log_level_choices,
	 log_level_parse, "lowest level logged"),
    ENUM("OUTBOX_LOG_FORMAT", log_format, "json", log_format_choices, NULL,
	 "log line format"),
};

/* Kafka settings of the table; every other OUTBOX_KAFKA_* is a property. */
static const char *const kafka_own[] = {"BROKERS", "TOPIC", "KEY_FROM", NULL};

struct loader {
	FILE *errs;
	int problems;
};

/* Printable, bounded and quoted so a problem stays on one line. */
static void put_value(FILE *f, const char *v)
{
	size_t n = 0;

	fputc('\'', f);
	for (; *v && n < 120; v++, n++) {
		unsigned char c = (unsigned char)*v;
		if (c == '\'' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			fprintf(f, "\\x%02x", c);
		else
			fputc(c, f);
	}
	fputs(*v ? "'..." : "'", f);
}

/*
 * One line: "config: NAME: what (got 'value')". A secret's value is never
 * printed; value NULL prints no suffix (the problem is not about it).
 */
__attribute__((format(printf, 5, 6))) static void
problem(struct loader *ld, const char *name, bool secret, const char *value,
	const char *fmt, ...)
{
	va_list ap;

	ld->problems++;
	if (!ld->errs)
		return;
	fprintf(ld->errs, "config: %s: ", name);
	va_start(ap, fmt);
	vfprintf(ld->errs, fmt, ap);
	va_end(ap);
	if (value && secret) {
		fputs(" (value hidden)", ld->errs);
	} else if (value) {
		fputs(" (got ", ld->errs);
		put_value(ld->errs, value);
		fputc(')', ld->errs);
	}
	fputc('\n', ld->errs);
}

static void free_secret(char *s, bool secret)
{
	if (s && secret)
		explicit_bzero(s, strlen(s));
	free(s);
}

/*
 * Reads the value of the file named by NAME_FILE into *out. Returns 1,
 * or -1 after reporting a problem that names the variable and the path,
 * never the content.
 */
static int file_read(struct loader *ld, const char *fname, const char *path,
		     char **out)
{
	FILE *f = NULL;
	char *buf = NULL;
	size_t len = 0;
	char msg[128];
	int ret = -1;

	if (*path == '\0') {
		problem(ld, fname, false, NULL, "empty file path");
		goto out;
	}
	f = fopen(path, "rbe");
	if (!f) {
		problem(ld, fname, false, NULL, "cannot read '%s': %s", path,
			strerror_r(errno, msg, sizeof(msg)));
		goto out;
	}
	buf = malloc(FILE_VALUE_MAX + 2);
	if (!buf) {
		problem(ld, fname, false, NULL, "out of memory");
		goto out;
	}
	len = fread(buf, 1, FILE_VALUE_MAX + 1, f);
	if (ferror(f)) {
		problem(ld, fname, false, NULL, "cannot read '%s': %s", path,
			strerror_r(errno, msg, sizeof(msg)));
		goto out;
	}
	if (len > FILE_VALUE_MAX) {
		problem(ld, fname, false, NULL,
			"file '%s' is larger than %d bytes", path,
			FILE_VALUE_MAX);
		goto out;
	}
	buf[len] = '\0';
	if (strlen(buf) != len) {
		problem(ld, fname, false, NULL, "file '%s' contains a NUL byte",
			path);
		goto out;
	}
	/* Editors and `echo` add a newline; it is never part of a value. */
	if (len > 0 && buf[len - 1] == '\n') {
		buf[--len] = '\0';
		if (len > 0 && buf[len - 1] == '\r')
			buf[--len] = '\0';
	}
	/* Copied so a short value does not hold the whole read buffer. */
	*out = strndup(buf, len);
	if (!*out) {
		problem(ld, fname, false, NULL, "out of memory");
		goto out;
	}
	ret = 1;
out:
	if (buf)
		explicit_bzero(buf, len + 1);
	free(buf);
	if (f)
		fclose(f);
	return ret;
}

/*
 * Reads NAME, or the file named by NAME_FILE, into *out (caller frees).
 * Returns 1 when set, 0 when neither is set, -1 after reporting a problem.
 */
static int env_read(struct loader *ld, const char *name, char **out)
{
	char fname[256];
	const char *direct, *path;

	*out = NULL;
	if ((size_t)snprintf(fname, sizeof(fname), "%s%s", name, FILE_SUFFIX) >=
	    sizeof(fname)) {
		problem(ld, name, false, NULL, "variable name too long");
		return -1;
	}
	direct = getenv(name);
	path = getenv(fname);
	if (direct && path) {
		problem(ld, name, false, NULL,
			"both %s and %s are set; set only one", name, fname);
		return -1;
	}
	if (path)
		return file_read(ld, fname, path, out);
	if (!direct)
		return 0;
	*out = strdup(direct);
	if (!*out) {
		problem(ld, name, false, NULL, "out of memory");
		return -1;
	}
	return 1;
}

static void format_duration(int64_t ms, char *buf, size_t len)
{
	static const struct {
		const char *unit;
		int64_t ms;
	} units[] = {{"d", DAY}, {"h", HOUR}, {"m", MINUTE}, {"s", SECOND}};

	if (ms != 0) {
		for (size_t i = 0; i < ARRAY_SIZE(units); i++) {
			if (ms % units[i].ms == 0) {
				snprintf(buf, len, "%" PRId64 "%s",
					 ms / units[i].ms, units[i].unit);
				return;
			}
		}
	}
	snprintf(buf, len, "%" PRId64 "%s", ms, ms ? "ms" : "");
}

/* Whole decimal integer, nothing before or after it. */
static int parse_int64(const char *s, int64_t *out, char *why, size_t whylen)
{
	const char *digits = s[0] == '-' ? s + 1 : s;
	char *end = NULL;
	long long n;

	if (!isdigit((unsigned char)digits[0])) {
		snprintf(why, whylen, "not a whole number");
		return -1;
	}
	errno = 0;
	n = strtoll(s, &end, 10);
	if (errno == ERANGE) {
		snprintf(why, whylen, "number out of range");
		return -1;
	}
	if (*end != '\0') {
		snprintf(why, whylen, "not a whole number");
		return -1;
	}
	*out = n;
	return 0;
}

static int parse_duration(const char *s, int64_t *ms, char *why, size_t whylen)
{
	static const struct {
		const char *unit;
		int64_t ms;
	} units[] = {
	    {"ms", 1}, {"s", SECOND}, {"m", MINUTE}, {"h", HOUR}, {"d", DAY}};
	char *end = NULL;
	long long n;

	if (strcmp(s, "0") == 0) {
		*ms = 0;
		return 0;
	}
	if (!isdigit((unsigned char)s[0]))
		goto bad;
	errno = 0;
	n = strtoll(s, &end, 10);
	for (size_t i = 0; i < ARRAY_SIZE(units); i++) {
		if (strcmp(end, units[i].unit) != 0)
			continue;
		if (errno == ERANGE || n > INT64_MAX / units[i].ms) {
			snprintf(why, whylen, "duration too large");
			return -1;
		}
		*ms = n * units[i].ms;
		return 0;
	}
bad:
	snprintf(why, whylen,
		 "not a duration: a whole number with a unit ms, s, m, h or d "
		 "(500ms, 2s, 1m), or 0");
	return -1;
}

static int parse_double(const char *s, double *out, char *why, size_t whylen)
{
	char *end = NULL;
	double d;

	/* strtod also takes "inf", "nan", hex and leading spaces: refuse. */
	if (!isdigit((unsigned char)s[0]) ||
	    s[strspn(s, "0123456789.eE+-")] != '\0')
		goto bad;
	errno = 0;
	d = strtod(s, &end);
	if (*end != '\0' || errno == ERANGE || !isfinite(d))
		goto bad;
	*out = d;
	return 0;
bad:
	snprintf(why, whylen, "not a number");
	return -1;
}

static int choice_index(const char *const *choices, const char *s)
{
	for (int i = 0; choices[i]; i++)
		if (strcmp(choices[i], s) == 0)
			return i;
	return -1;
}

static void choices_text(const char *const *choices, const char *sep, char *buf,
			 size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (size_t i = 0; choices[i] && used < len; i++) {
		int n = snprintf(buf + used, len - used, "%s%s", i ? sep : "",
				 choices[i]);
		if (n < 0)
			break;
		used += (size_t)n;
	}
}

/* The constraint a value must meet, for errors, --help and the README. */
static void setting_range(const struct setting *s, char *buf, size_t len)
{
	char lo[32], hi[32], list[128];

	switch (s->type) {
	case SET_WORD:
	case SET_ENUM:
		choices_text(s->choices, ", ", list, sizeof(list));
		snprintf(buf, len, "one of: %s", list);
		break;
	case SET_BOOL:
		snprintf(buf, len, "on, off, true or false");
		break;
	case SET_INT:
	case SET_DOUBLE:
		snprintf(buf, len, "%" PRId64 "..%" PRId64, s->min, s->max);
		break;
	case SET_DURATION:
		format_duration(s->min, lo, sizeof(lo));
		format_duration(s->max, hi, sizeof(hi));
		snprintf(buf, len, "%s%s..%s",
			 s->flags & SETTING_ZERO_OK ? "0 or " : "", lo, hi);
		break;
	case SET_STRING:
		buf[0] = '\0';
		break;
	}
}

static void *setting_field(const struct setting *s, struct config *cfg)
{
	return (char *)cfg + s->offset;
}

/*
 * Parses value into the row's field, whose C type FIELD() checked at
 * compile time; on failure says why in why.
 */
static int setting_apply(const struct setting *s, const char *value,
			 struct config *cfg, char *why, size_t whylen)
{
	void *field = setting_field(s, cfg);
	char range[160];
	int64_t n = 0;
	double d = 0;
	char *copy;
	int idx;

	setting_range(s, range, sizeof(range));
	switch (s->type) {
	case SET_STRING:
		if (s->check && s->check(value, why, whylen) != 0)
			return -1;
		copy = strdup(value);
		if (!copy)
			goto oom;
		*(char **)field = copy;
		return 0;
	case SET_WORD:
		idx = choice_index(s->choices, value);
		if (idx < 0)
			goto out_of_range;
		copy = strdup(s->choices[idx]);
		if (!copy)
			goto oom;
		*(char **)field = copy;
		return 0;
	case SET_ENUM:
		idx = s->lookup ? s->lookup(value)
				: choice_index(s->choices, value);
		if (idx < 0)
			goto out_of_range;
		/* The enum's own type differs per row; only its size is
		 * checked (ENUM_FIELD), so copy the bytes. */
		memcpy(field, &idx, sizeof(idx));
		return 0;
	case SET_BOOL:
		if (strcmp(value, "on") == 0 || strcmp(value, "true") == 0)
			*(bool *)field = true;
		else if (strcmp(value, "off") == 0 ||
			 strcmp(value, "false") == 0)
			*(bool *)field = false;
		else
			goto out_of_range;
		return 0;
	case SET_INT:
		if (parse_int64(value, &n, why, whylen) != 0)
			return -1;
		if (n < s->min || n > s->max)
			goto out_of_range;
		*(int *)field = (int)n;
		return 0;
	case SET_DOUBLE:
		if (parse_double(value, &d, why, whylen) != 0)
			return -1;
		if (d < (double)s->min || d > (double)s->max)
			goto out_of_range;
		*(double *)field = d;
		return 0;
	case SET_DURATION:
		if (parse_duration(value, &n, why, whylen) != 0)
			return -1;
		if (!(n == 0 && (s->flags & SETTING_ZERO_OK)) &&
		    (n < s->min || n > s->max))
			goto out_of_range;
		*(int64_t *)field = n;
		return 0;
	}
	snprintf(why, whylen, "unknown setting type");
	return -1;
out_of_range:
	if (s->type == SET_WORD || s->type == SET_ENUM)
		snprintf(why, whylen, "unknown value; use %s", range);
	else if (s->type == SET_BOOL)
		snprintf(why, whylen, "not a boolean; use %s", range);
	else
		snprintf(why, whylen, "out of range; allowed %s", range);
	return -1;
oom:
	snprintf(why, whylen, "out of memory");
	return -1;
}

static void setting_load(struct loader *ld, const struct setting *s,
			 struct config *cfg, bool *bad)
{
	bool secret = s->flags & SETTING_SECRET;
	const char *value;
	char why[256];
	char *raw = NULL;
	int rc;

	rc = env_read(ld, s->name, &raw);
	if (rc < 0) {
		*bad = true;
		goto out;
	}
	value = rc > 0 ? raw : s->def;
	if ((s->flags & SETTING_NULLABLE) && (!value || *value == '\0'))
		goto out;
	if (!value) {
		/* A row without default that cannot be NULL is required. */
		problem(ld, s->name, false, NULL, "must be set");
		*bad = true;
		goto out;
	}
	if (setting_apply(s, value, cfg, why, sizeof(why)) != 0) {
		problem(ld, s->name, secret, value, "%s", why);
		*bad = true;
	}
out:
	free_secret(raw, secret);
}

/* libpq's own parser: its message may quote the password, so drop it. */
static int check_conninfo(const char *v, char *why, size_t whylen)
{
	PQconninfoOption *opts;
	char *msg = NULL;

	opts = PQconninfoParse(v, &msg);
	PQfreemem(msg);
	if (!opts) {
		snprintf(why, whylen,
			 "not a valid libpq connection URI or key=value "
			 "string");
		return -1;
	}
	PQconninfoFree(opts);
	return 0;
}

static int check_ident(const char *p, size_t n, char *why, size_t whylen)
{
	if (n == 0) {
		snprintf(why, whylen, "empty name");
		return -1;
	}
	if (n > TABLE_PART_MAX) {
		snprintf(why, whylen,
			 "each name part must be at most %d bytes so derived "
			 "index and trigger names fit in 63",
			 TABLE_PART_MAX);
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)p[i];
		if (!(isalpha(c) || c == '_' || (i > 0 && isdigit(c)))) {
			snprintf(why, whylen,
				 "must be name or schema.name, each matching "
				 "[A-Za-z_][A-Za-z0-9_]*");
			return -1;
		}
	}
	return 0;
}

static int check_table(const char *v, char *why, size_t whylen)
{
	const char *dot = strchr(v, '.');

	if (!dot)
		return check_ident(v, strlen(v), why, whylen);
	if (check_ident(v, (size_t)(dot - v), why, whylen) != 0)
		return -1;
	return check_ident(dot + 1, strlen(dot + 1), why, whylen);
}

/* The parser the AMQP backend uses, so what passes here connects. */
static int check_amqp_url(const char *v, char *why, size_t whylen)
{
	struct amqp_connection_info info;
	char *copy = strdup(v);
	int ret = -1;

	if (!copy) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	amqp_default_connection_info(&info);
	if (amqp_parse_url(copy, &info) != AMQP_STATUS_OK)
		snprintf(why, whylen,
			 "not an AMQP URL "
			 "(amqp://user:password@host:port/vhost or amqps://)");
	else if (info.vhost[0] == '\0')
		/* "amqp://host/" names the vhost "", which brokers refuse. */
		snprintf(why, whylen,
			 "empty virtual host: drop the trailing '/' for "
			 "vhost '/', or write it as %%2f");
	else
		ret = 0;
	explicit_bzero(copy, strlen(v));
	free(copy);
	return ret;
}

static bool has_control(const char *v)
{
	for (; *v; v++)
		if ((unsigned char)*v < 0x20 || *v == 0x7f)
			return true;
	return false;
}

/* The backend registry is the one list of publishers. */
static int check_publisher(const char *v, char *why, size_t whylen)
{
	if (publisher_find(v))
		return 0;
	size_t used = (size_t)snprintf(why, whylen, "unknown backend; one of");
	for (size_t i = 0; publisher_registry[i] && used < whylen; i++)
		used +=
		    (size_t)snprintf(why + used, whylen - used, "%s %s",
				     i ? "," : "", publisher_registry[i]->name);
	return -1;
}

static int check_exchange(const char *v, char *why, size_t whylen)
{
	if (strlen(v) > 255 || has_control(v)) {
		snprintf(why, whylen,
			 "must be at most 255 bytes without control "
			 "characters");
		return -1;
	}
	return 0;
}

static int check_brokers(const char *v, char *why, size_t whylen)
{
	const char *p = v;

	for (;;) {
		size_t n = strcspn(p, ",");
		if (n == 0 || strspn(p, " \t") == n) {
			snprintf(why, whylen,
				 "must be a comma-separated list of host:port "
				 "without empty entries");
			return -1;
		}
		if (p[n] == '\0')
			break;
		p += n + 1;
	}
	if (has_control(v)) {
		snprintf(why, whylen, "contains control characters");
		return -1;
	}
	return 0;
}

static int check_topic(const char *v, char *why, size_t whylen)
{
	size_t n = strlen(v);

	if (n == 0 || n > 249 || strcmp(v, ".") == 0 || strcmp(v, "..") == 0 ||
	    v[strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
			"0123456789._-")] != '\0') {
		snprintf(why, whylen,
			 "must be a Kafka topic name: 1 to 249 of "
			 "[A-Za-z0-9._-], not . or ..");
		return -1;
	}
	return 0;
}

static int check_ce_source(const char *v, char *why, size_t whylen)
{
	if (*v == '\0' || strlen(v) > 1024 || has_control(v)) {
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
	if (has_control(v) || memchr(v, ' ', hostlen)) {
		snprintf(why, whylen,
			 "host contains spaces or control "
			 "characters");
		return -1;
	}
	if (parse_int64(colon + 1, &port, why, whylen) != 0 || port < 1 ||
	    port > 65535) {
		snprintf(why, whylen, "port must be within 1..65535");
		return -1;
	}
	return 0;
}

/*
 * Values to hide: passwords, client secrets, OAuth settings (which may
 * embed a secret) and PEM keys. Over-hiding a certificate costs nothing.
 */
static bool kafka_prop_secret(const char *name)
{
	size_t n = strlen(name);

	return strstr(name, "password") || strstr(name, "secret") ||
	       strstr(name, "oauthbearer") ||
	       (n >= 4 && strcmp(name + n - 4, ".pem") == 0);
}

/* OUTBOX_KAFKA_SASL_MECHANISM -> sasl.mechanism; -1 when not a name. */
static int kafka_prop_name(const char *rest, size_t n, char **out)
{
	char *name;

	if (n == 0 || rest[0] == '_' || rest[n - 1] == '_')
		return -1;
	name = malloc(n + 1);
	if (!name)
		return -2;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)rest[i];
		if (c == '_' && rest[i + 1] == '_') {
			free(name);
			return -1;
		}
		if (c == '_')
			name[i] = '.';
		else if (isalnum(c))
			name[i] = (char)tolower(c);
		else {
			free(name);
			return -1;
		}
	}
	name[n] = '\0';
	*out = name;
	return 0;
}

/* Properties that would void the relay's guarantees, or bypass a setting. */
static void kafka_prop_check(struct loader *ld, const char *var,
			     const struct config_kafka_prop *p,
			     const struct config *cfg, bool publish_ok)
{
	char budget[32];
	int64_t ms;
	char why[128];

	if (strcmp(p->name, "enable.idempotence") == 0 &&
	    strcmp(p->value, "true") != 0) {
		problem(ld, var, p->secret, p->value,
			"the relay requires enable.idempotence=true so "
			"retries neither duplicate nor reorder messages");
	} else if ((strcmp(p->name, "acks") == 0 ||
		    strcmp(p->name, "request.required.acks") == 0) &&
		   strcmp(p->value, "all") != 0 &&
		   strcmp(p->value, "-1") != 0) {
		problem(ld, var, p->secret, p->value,
			"the relay requires %s=all (or -1) so an ack means "
			"every in-sync replica has the message",
			p->name);
	} else if (strcmp(p->name, "bootstrap.servers") == 0 ||
		   strcmp(p->name, "metadata.broker.list") == 0) {
		problem(ld, var, false, NULL,
			"set the brokers with OUTBOX_KAFKA_BROKERS");
	} else if (strcmp(p->name, "message.timeout.ms") == 0 ||
		   strcmp(p->name, "delivery.timeout.ms") == 0) {
		if (parse_int64(p->value, &ms, why, sizeof(why)) != 0 ||
		    ms < 1) {
			problem(ld, var, p->secret, p->value,
				"%s must be a positive whole number of "
				"milliseconds (0 would never time out)",
				p->name);
		} else if (publish_ok && ms > cfg->publish_timeout_ms) {
			format_duration(cfg->publish_timeout_ms, budget,
					sizeof(budget));
			problem(ld, var, p->secret, p->value,
				"%s must not exceed OUTBOX_PUBLISH_TIMEOUT "
				"(%s = %" PRId64 " ms) so no message "
				"outlives its lease",
				p->name, budget, cfg->publish_timeout_ms);
		}
	}
}

static bool kafka_own_var(const char *rest, size_t n)
{
	for (size_t i = 0; kafka_own[i]; i++)
		if (strlen(kafka_own[i]) == n &&
		    strncmp(rest, kafka_own[i], n) == 0)
			return true;
	return false;
}

static bool ends_with_file(const char *s, size_t n)
{
	size_t k = strlen(FILE_SUFFIX);
	return n >= k && strncmp(s + n - k, FILE_SUFFIX, k) == 0;
}

static int kafka_prop_cmp(const void *a, const void *b)
{
	const struct config_kafka_prop *pa = a, *pb = b;
	return strcmp(pa->name, pb->name);
}

/* One OUTBOX_KAFKA_<PROPERTY> variable (var without _FILE). */
static void kafka_prop_load(struct loader *ld, const char *var,
			    struct config *cfg, bool publish_ok)
{
	const char *rest = var + strlen(KAFKA_PREFIX);
	struct config_kafka_prop prop = {0};
	struct config_kafka_prop *grown;
	char *value = NULL;
	int rc;

	rc = kafka_prop_name(rest, strlen(rest), &prop.name);
	if (rc == -2) {
		problem(ld, var, false, NULL, "out of memory");
		goto out;
	}
	if (rc != 0) {
		problem(ld, var, false, NULL,
			"not a librdkafka property: OUTBOX_KAFKA_ must be "
			"followed by the property name with dots written as "
			"single underscores");
		goto out;
	}
	prop.secret = kafka_prop_secret(prop.name);
	if (env_read(ld, var, &value) <= 0)
		goto out;
	for (size_t i = 0; i < cfg->n_kafka_props; i++) {
		if (strcmp(cfg->kafka_props[i].name, prop.name) == 0) {
			problem(ld, var, false, NULL,
				"property '%s' is set by more than one "
				"variable",
				prop.name);
			goto out;
		}
	}
	prop.value = value;
	kafka_prop_check(ld, var, &prop, cfg, publish_ok);
	grown = realloc(cfg->kafka_props,
			(cfg->n_kafka_props + 1) * sizeof(*grown));
	if (!grown) {
		problem(ld, var, false, NULL, "out of memory");
		goto out;
	}
	cfg->kafka_props = grown;
	cfg->kafka_props[cfg->n_kafka_props++] = prop;
	prop.name = NULL;
	value = NULL;
out:
	free(prop.name);
	free_secret(value, prop.secret);
}

/* Every OUTBOX_KAFKA_* variable that is not a setting of the table. */
static void kafka_props_load(struct loader *ld, struct config *cfg,
			     bool publish_ok)
{
	size_t plen = strlen(KAFKA_PREFIX);

	for (char **e = environ; e && *e; e++) {
		const char *eq = strchr(*e, '=');
		size_t n = eq ? (size_t)(eq - *e) : strlen(*e);
		const char *rest;
		size_t restlen;
		bool is_file;
		char *var;

		if (n < plen || strncmp(*e, KAFKA_PREFIX, plen) != 0)
			continue;
		rest = *e + plen;
		restlen = n - plen;
		is_file = ends_with_file(rest, restlen);
		if (is_file)
			restlen -= strlen(FILE_SUFFIX);
		if (kafka_own_var(rest, restlen))
			continue;
		var = strndup(*e, plen + restlen);
		if (!var) {
			problem(ld, KAFKA_PREFIX, false, NULL, "out of memory");
			continue;
		}
		/* With both NAME and NAME_FILE set, NAME reports it once. */
		if (!is_file || !getenv(var))
			kafka_prop_load(ld, var, cfg, publish_ok);
		free(var);
	}
	if (cfg->n_kafka_props > 1)
		qsort(cfg->kafka_props, cfg->n_kafka_props,
		      sizeof(cfg->kafka_props[0]), kafka_prop_cmp);
}

static bool field_ok(const bool *bad, size_t offset)
{
	for (size_t i = 0; i < ARRAY_SIZE(settings); i++)
		if (settings[i].offset == offset)
			return !bad[i];
	return false;
}

#define OK(f) field_ok(bad, offsetof(struct config, f))

/* Section 4: settings that would let a lease expire under a live batch. */
static void cross_check(struct loader *ld, const struct config *cfg,
			const bool *bad)
{
	char a[32], b[32], c[32];

	if (OK(publish_timeout_ms) && OK(statement_timeout_ms) &&
	    OK(lease_timeout_ms) &&
	    cfg->publish_timeout_ms + cfg->statement_timeout_ms >=
		cfg->lease_timeout_ms) {
		format_duration(cfg->publish_timeout_ms, a, sizeof(a));
		format_duration(cfg->statement_timeout_ms, b, sizeof(b));
		format_duration(cfg->lease_timeout_ms, c, sizeof(c));
		problem(ld, "OUTBOX_PUBLISH_TIMEOUT", false, NULL,
			"publish timeout %s plus OUTBOX_STATEMENT_TIMEOUT %s "
			"(the mark budget) must be less than "
			"OUTBOX_LEASE_TIMEOUT %s",
			a, b, c);
	}
	if (OK(sweep_interval_ms) && OK(lease_timeout_ms) &&
	    cfg->sweep_interval_ms >= cfg->lease_timeout_ms) {
		format_duration(cfg->sweep_interval_ms, a, sizeof(a));
		format_duration(cfg->lease_timeout_ms, b, sizeof(b));
		problem(ld, "OUTBOX_SWEEP_INTERVAL", false, NULL,
			"sweep interval %s must be less than "
			"OUTBOX_LEASE_TIMEOUT %s",
			a, b);
	}
	if (OK(backoff_base_ms) && OK(backoff_max_ms) &&
	    cfg->backoff_base_ms > cfg->backoff_max_ms) {
		format_duration(cfg->backoff_base_ms, a, sizeof(a));
		format_duration(cfg->backoff_max_ms, b, sizeof(b));
		problem(ld, "OUTBOX_BACKOFF_BASE", false, NULL,
			"backoff base %s must not exceed OUTBOX_BACKOFF_MAX %s",
			a, b);
	}
	if (OK(shutdown_timeout_ms) && OK(statement_timeout_ms) &&
	    cfg->shutdown_timeout_ms <= cfg->statement_timeout_ms) {
		format_duration(cfg->shutdown_timeout_ms, a, sizeof(a));
		format_duration(cfg->statement_timeout_ms, b, sizeof(b));
		problem(ld, "OUTBOX_SHUTDOWN_TIMEOUT", false, NULL,
			"shutdown timeout %s must be greater than "
			"OUTBOX_STATEMENT_TIMEOUT %s, which it keeps for "
			"writing outcomes",
			a, b);
	}
}

int config_load(struct config *cfg, FILE *errs)
{
	struct loader ld = {.errs = errs, .problems = 0};
	bool bad[ARRAY_SIZE(settings)] = {false};

	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < ARRAY_SIZE(settings); i++)
		setting_load(&ld, &settings[i], cfg, &bad[i]);
	kafka_props_load(&ld, cfg, OK(publish_timeout_ms));
	cross_check(&ld, cfg, bad);
	if (errs)
		fflush(errs);
	return ld.problems;
}

void config_release(struct config *cfg)
{
	for (size_t i = 0; i < ARRAY_SIZE(settings); i++) {
		const struct setting *s = &settings[i];

		if (s->type == SET_STRING || s->type == SET_WORD)
			free_secret(*(char **)setting_field(s, cfg),
				    s->flags & SETTING_SECRET);
	}
	for (size_t i = 0; i < cfg->n_kafka_props; i++) {
		free(cfg->kafka_props[i].name);
		free_secret(cfg->kafka_props[i].value,
			    cfg->kafka_props[i].secret);
	}
	free(cfg->kafka_props);
	memset(cfg, 0, sizeof(*cfg));
}

static const char *default_text(const struct setting *s)
{
	if (!s->def)
		return "unset";
	return s->def[0] ? s->def : "\"\"";
}

/* Words of text on lines of at most 80 columns, each indented by 6. */
static void put_wrapped(FILE *out, const char *text)
{
	size_t col = 0;

	while (*text) {
		size_t n = strcspn(text, " ");

		if (col > 0 && col + 1 + n > 80 - 6) {
			fputc('\n', out);
			col = 0;
		}
		fprintf(out, "%s%.*s", col ? " " : "      ", (int)n, text);
		col += n + (col ? 1 : 0);
		text += n;
		text += strspn(text, " ");
	}
	fputc('\n', out);
}

void config_print_help(FILE *out)
{
	char range[160], text[512];

	fputs("Settings (environment variables). Each NAME can instead be "
	      "read from the file\nnamed by NAME_FILE; setting both is an "
	      "error. Durations take a unit: 500ms,\n2s, 1m, 1h, 7d.\n\n",
	      out);
	for (size_t i = 0; i < ARRAY_SIZE(settings); i++) {
		const struct setting *s = &settings[i];

		setting_range(s, range, sizeof(range));
		fprintf(out, "  %s (default: %s%s)\n", s->name, default_text(s),
			s->flags & SETTING_SECRET ? ", secret" : "");
		snprintf(text, sizeof(text), "%s%s%s%s", s->help,
			 range[0] ? " [" : "", range, range[0] ? "]" : "");
		put_wrapped(out, text);
	}
	fputs("  OUTBOX_KAFKA_<PROPERTY>\n      any librdkafka property, "
	      "lower-cased with underscores as dots\n      "
	      "(OUTBOX_KAFKA_SASL_MECHANISM=PLAIN -> sasl.mechanism); "
	      "passwords,\n      secrets and PEM values are never logged\n",
	      out);
}

/* Markdown cells must not contain a bare '|'. */
static void put_cell(FILE *out, const char *s)
{
	for (; *s; s++) {
		if (*s == '|')
			fputc('\\', out);
		fputc(*s, out);
	}
}

void config_print_markdown(FILE *out)
{
	char range[160];

	fputs("| Variable | Default | Meaning |\n|---|---|---|\n", out);
	for (size_t i = 0; i < ARRAY_SIZE(settings); i++) {
		const struct setting *s = &settings[i];

		setting_range(s, range, sizeof(range));
		fprintf(out, "| `%s` | ", s->name);
		if (s->def) {
			fputc('`', out);
			put_cell(out, default_text(s));
			fputc('`', out);
		} else {
			fputs("unset", out);
		}
		fputs(" | ", out);
		put_cell(out, s->help);
		if (range[0]) {
			fputs(" (", out);
			put_cell(out, range);
			fputc(')', out);
		}
		if (s->flags & SETTING_SECRET)
			fputs("; secret, never logged", out);
		fputs(" |\n", out);
	}
	fputs("| `OUTBOX_KAFKA_<PROPERTY>` | unset | any librdkafka "
	      "property, lower-cased with underscores as dots "
	      "(`OUTBOX_KAFKA_SASL_MECHANISM` sets `sasl.mechanism`); "
	      "`enable.idempotence` must stay `true` and `acks` `all` |\n",
	      out);
}

/* Appends to a fixed buffer, truncating, always leaving room for NUL. */
struct outbuf {
	char *p;
	size_t len, cap;
};

static void ob_put(struct outbuf *o, const char *s, size_t n)
{
	size_t room = o->cap - 1 - o->len;

	if (n > room)
		n = room;
	memcpy(o->p + o->len, s, n);
	o->len += n;
	o->p[o->len] = '\0';
}

static bool is_password_key(const char *key, size_t n)
{
	static const char word[] = "password";
	size_t k = sizeof(word) - 1;

	for (size_t i = 0; i + k <= n; i++)
		if (strncasecmp(key + i, word, k) == 0)
			return true;
	return false;
}

/*
 * key=value pairs after '?' in a URI. Split on '&' only: a '#' inside an
 * unescaped password must not end the redaction early.
 */
static void redact_query(struct outbuf *o, const char *q)
{
	for (;;) {
		size_t n = strcspn(q, "&");
		const char *eq = memchr(q, '=', n);

		if (eq && is_password_key(q, (size_t)(eq - q))) {
			ob_put(o, q, (size_t)(eq - q) + 1);
			ob_put(o, "***", 3);
		} else {
			ob_put(o, q, n);
		}
		q += n;
		if (*q == '\0')
			break;
		ob_put(o, q++, 1);
	}
}

static void redact_uri(struct outbuf *o, const char *url, const char *sep)
{
	const char *auth = sep + 3;
	/* The last '@': an unescaped '@' in a password must not leak. */
	const char *at = strrchr(auth, '@');
	const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
	const char *rest = auth;
	const char *q;

	ob_put(o, url, (size_t)(auth - url));
	if (colon) {
		ob_put(o, auth, (size_t)(colon - auth) + 1);
		ob_put(o, "***", 3);
		rest = at;
	}
	q = strchr(rest, '?');
	if (!q) {
		ob_put(o, rest, strlen(rest));
		return;
	}
	ob_put(o, rest, (size_t)(q - rest) + 1);
	redact_query(o, q + 1);
}

/* libpq key = value pairs; values may be 'quoted' and use \ escapes. */
static void redact_conninfo(struct outbuf *o, const char *s)
{
	while (*s) {
		size_t ws = strspn(s, " \t\r\n\f\v");
		const char *key, *v;
		size_t keylen;
		bool hide;

		ob_put(o, s, ws);
		s += ws;
		if (*s == '\0')
			break;
		key = s;
		keylen = strcspn(s, "= \t\r\n\f\v");
		s += keylen;
		s += strspn(s, " \t\r\n\f\v");
		if (*s != '=') {
			/* Not key=value: copy the word and go on. */
			ob_put(o, key, (size_t)(s - key));
			continue;
		}
		s++;
		s += strspn(s, " \t\r\n\f\v");
		hide = is_password_key(key, keylen);
		ob_put(o, key, (size_t)(s - key));
		v = s;
		if (*s == '\'') {
			for (s++; *s && *s != '\''; s++)
				if (*s == '\\' && s[1])
					s++;
			if (*s == '\'')
				s++;
		} else {
			for (; *s && !isspace((unsigned char)*s); s++)
				if (*s == '\\' && s[1])
					s++;
		}
		if (hide)
			ob_put(o, "***", 3);
		else
			ob_put(o, v, (size_t)(s - v));
	}
}

/* "scheme://" where scheme is [A-Za-z][A-Za-z0-9+.-]*; else NULL. */
static const char *uri_scheme_end(const char *url)
{
	size_t n;

	if (!isalpha((unsigned char)url[0]))
		return NULL;
	n = strspn(url, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
			"0123456789+.-");
	return strncmp(url + n, "://", 3) == 0 ? url + n : NULL;
}

void config_redact_url(const char *url, char *out, size_t outlen)
{
	struct outbuf o = {.p = out, .len = 0, .cap = outlen};
	const char *sep;

	if (!out || outlen == 0)
		return;
	out[0] = '\0';
	if (!url)
		return;
	sep = uri_scheme_end(url);
	if (sep)
		redact_uri(&o, url, sep);
	else
		redact_conninfo(&o, url);
}

bool config_knows(const char *name)
{
	size_t plen = strlen(KAFKA_PREFIX);
	size_t n;

	if (!name)
		return false;
	n = strlen(name);
	if (ends_with_file(name, n))
		n -= strlen(FILE_SUFFIX);
	for (size_t i = 0; i < ARRAY_SIZE(settings); i++)
		if (strlen(settings[i].name) == n &&
		    strncmp(settings[i].name, name, n) == 0)
			return true;
	return n > plen && strncmp(name, KAFKA_PREFIX, plen) == 0;
}
