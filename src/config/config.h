/* SPDX-License-Identifier: MIT */
/*
 * Settings: tables of rows drive parsing from the environment (and
 * NAME_FILE), validation, the cross-checks of docs/design.md §4,
 * --help and the README's settings table. The core table lives here; the
 * parts above config (the publisher backends) bring their own rows as
 * settings groups through struct config_extensions, so config never needs
 * to know them.
 *
 * Ownership: config_load() fills a struct config whose strings and group
 * structs it owns; config_release() frees them. After startup the struct
 * is read-only and shared by every thread without locking.
 */
#ifndef OUTBOX_CONFIG_H
#define OUTBOX_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum config_ce_mode { CE_MODE_BINARY, CE_MODE_STRUCTURED };
enum config_ordering { ORDERING_NONE, ORDERING_PARTITION };
enum config_on_failure { ON_FAILURE_SKIP, ON_FAILURE_BLOCK };
enum config_log_format { LOG_FORMAT_JSON, LOG_FORMAT_TEXT };
/* OUTBOX_PG_PREPARE: named statements prepared once a session (on),
 * none (off), or, behind a transaction-mode pooler, prepared once a
 * server connection and found there again (pooled). */
enum config_pg_prepare { PG_PREPARE_ON, PG_PREPARE_OFF, PG_PREPARE_POOLED };

/*
 * Settings rows. A row names a variable, the C type it parses into and
 * where that field sits in its target struct: struct config for the core
 * settings, a group's own struct for a settings group (below).
 */
enum setting_type {
	SET_STRING,   /* char *, validated by check() when given */
	SET_WORD,     /* char *, one of choices, stored as that choice */
	SET_ENUM,     /* int-sized enum: index into choices, or lookup() */
	SET_BOOL,     /* bool: on|off|true|false */
	SET_INT,      /* int within [min, max] */
	SET_DOUBLE,   /* double within [min, max] */
	SET_DURATION, /* int64_t milliseconds within [min, max] */
	SET_SIZE,     /* int64_t bytes within [min, max]: 512KiB, 16MiB */
};

enum setting_flags {
	SETTING_SECRET = 1 << 0,   /* the value is never printed */
	SETTING_NULLABLE = 1 << 1, /* unset or empty leaves the field NULL */
	SETTING_ZERO_OK = 1 << 2,  /* 0 is allowed below min and means off */
};

struct setting {
	const char *name;
	enum setting_type type;
	size_t offset;	 /* into the target struct */
	const char *def; /* as text; NULL: unset (NULLABLE) or required */
	int64_t min, max;
	const char *const *choices;   /* NULL-terminated */
	int (*lookup)(const char *s); /* SET_ENUM: value, or -1 when unknown */
	int (*check)(const char *value, char *why, size_t whylen);
	unsigned flags;
	const char *help;
};

#define SETTING_SECOND INT64_C(1000)
#define SETTING_MINUTE (60 * SETTING_SECOND)
#define SETTING_HOUR (60 * SETTING_MINUTE)
#define SETTING_DAY (24 * SETTING_HOUR)

#define SETTING_KIB INT64_C(1024)
#define SETTING_MIB (1024 * SETTING_KIB)
#define SETTING_GIB (1024 * SETTING_MIB)

/* Worker lanes over all workers (OUTBOX_WORKERS x OUTBOX_WORKER_WINDOW),
 * each a thread with its own Postgres sessions. */
#define CONFIG_MAX_LANES 64

/*
 * offsetof() into target struct T that refuses to compile unless the
 * field has the C type the row's parser writes through the offset, so a
 * row can never point a parser at a field of another type. An enum's own
 * type differs per row, so only its size is checked.
 */
#define SETTING_FIELD_IS(T, f, FT) _Generic(((T *)0)->f, FT : 1, default : 0)
#define SETTING_CHECKED(offset, ok) ((offset) + 0 * sizeof(char[(ok) ? 1 : -1]))
#define SETTING_FIELD(T, f, FT)                                                \
	SETTING_CHECKED(offsetof(T, f), SETTING_FIELD_IS(T, f, FT))
#define SETTING_ENUM_FIELD(T, f)                                               \
	SETTING_CHECKED(offsetof(T, f), sizeof(((T *)0)->f) == sizeof(int))

#define SETTING_STRING(T, n, f, d, chk, fl, h)                                 \
	{                                                                      \
		.name = n, .type = SET_STRING,                                 \
		.offset = SETTING_FIELD(T, f, char *), .def = d, .check = chk, \
		.flags = fl, .help = h                                         \
	}
#define SETTING_WORD(T, n, f, d, ch, h)                                        \
	{                                                                      \
		.name = n, .type = SET_WORD,                                   \
		.offset = SETTING_FIELD(T, f, char *), .def = d,               \
		.choices = ch, .help = h                                       \
	}
#define SETTING_ENUM(T, n, f, d, ch, lk, h)                                    \
	{                                                                      \
		.name = n, .type = SET_ENUM,                                   \
		.offset = SETTING_ENUM_FIELD(T, f), .def = d, .choices = ch,   \
		.lookup = lk, .help = h                                        \
	}
#define SETTING_BOOL(T, n, f, d, h)                                            \
	{                                                                      \
		.name = n, .type = SET_BOOL,                                   \
		.offset = SETTING_FIELD(T, f, bool), .def = d, .help = h       \
	}
#define SETTING_INT(T, n, f, d, lo, hi, h)                                     \
	{                                                                      \
		.name = n, .type = SET_INT,                                    \
		.offset = SETTING_FIELD(T, f, int), .def = d, .min = lo,       \
		.max = hi, .help = h                                           \
	}
#define SETTING_DOUBLE(T, n, f, d, lo, hi, h)                                  \
	{                                                                      \
		.name = n, .type = SET_DOUBLE,                                 \
		.offset = SETTING_FIELD(T, f, double), .def = d, .min = lo,    \
		.max = hi, .help = h                                           \
	}
#define SETTING_DURATION(T, n, f, d, lo, hi, fl, h)                            \
	{                                                                      \
		.name = n, .type = SET_DURATION,                               \
		.offset = SETTING_FIELD(T, f, int64_t), .def = d, .min = lo,   \
		.max = hi, .flags = fl, .help = h                              \
	}

#define SETTING_SIZE(T, n, f, d, lo, hi, h)                                    \
	{                                                                      \
		.name = n, .type = SET_SIZE,                                   \
		.offset = SETTING_FIELD(T, f, int64_t), .def = d, .min = lo,   \
		.max = hi, .help = h                                           \
	}

/* The state of one config_load(), lent to a group's hooks so that their
 * problems are reported and counted like the core's. */
struct config_loader;

struct config;

/*
 * A settings group: the rows of one part above config (a publisher
 * backend) and the struct they fill. config_load() allocates that struct
 * (size bytes, zeroed), fills it from the rows and keeps it in struct
 * config; config_release() frees its strings, calls release() and frees
 * it. --help, the README table and config_knows() cover every group.
 */
struct config_group {
	const struct setting *rows;
	size_t n_rows;
	size_t size; /* of the struct the rows fill */
	/* Every other variable starting with prefix is handed to
	 * load_extra() (var without its _FILE suffix) once the core
	 * settings and the group's rows are read. NULL: none. */
	const char *prefix;
	void (*load_extra)(struct config_loader *ld, const struct config *cfg,
			   const char *var, void *data);
	/* Frees what load_extra() stored in data. May be NULL. */
	void (*release)(void *data);
	/* The prefix variables' entry in --help (whole indented lines) and
	 * their README table row (one whole line). May be NULL. */
	const char *prefix_help;
	const char *prefix_markdown;
};

/* What the parts above config lend config_load() and the printers. */
struct config_extensions {
	/* Settings groups, NULL-terminated; NULL: none. */
	const struct config_group *const *groups;
	/* OUTBOX_PUBLISHER: 0, or -1 with why set. NULL accepts any. */
	int (*check_publisher)(const char *name, char *why, size_t whylen);
	/* OUTBOX_PUBLISHER's help, naming the backends; NULL: generic. */
	const char *publisher_help;
	/* OUTBOX_DATABASE_URL and OUTBOX_LISTEN_DATABASE_URL: 0, or -1 with
	 * why set, never quoting the value. NULL accepts any. */
	int (*check_conninfo)(const char *conninfo, char *why, size_t whylen);
	/* OUTBOX_CE_SOURCE, the encoder's URI-reference check: 0, or -1
	 * with why set. NULL: config's own check (non-empty, at most 1024
	 * bytes, no control character). */
	int (*check_ce_source)(const char *source, char *why, size_t whylen);
};

#define CONFIG_GROUPS_MAX 8
#define CONFIG_WARNINGS_MAX 2048

/* One loaded settings group, owned by the struct config holding it. */
struct config_part {
	const struct config_group *group;
	void *data;
};

/* The most databases OUTBOX_DATABASES may name, and a name's length. */
#define CONFIG_DATABASES_MAX 64
#define CONFIG_DATABASE_NAME_MAX 32

/* One database of OUTBOX_DATABASES. */
struct config_database {
	char name[CONFIG_DATABASE_NAME_MAX + 1];
	char *url;	  /* OUTBOX_DATABASE_URL_<NAME>, a secret */
	char *listen_url; /* OUTBOX_LISTEN_DATABASE_URL_<NAME>; NULL: url */
};

/* The relay's databases: OUTBOX_DATABASES' or, without it, the one of
 * OUTBOX_DATABASE_URL (named ""). d is below config_n_databases(). */
size_t config_n_databases(const struct config *cfg);
const char *config_database_name(const struct config *cfg, size_t d);
const char *config_database_url(const struct config *cfg, size_t d);
/* NULL: LISTEN uses the database's URL. */
const char *config_listen_url(const struct config *cfg, size_t d);
/* The variable that sets base (say "OUTBOX_LISTEN_DATABASE_URL") for
 * database d: base itself for the one database, base_<NAME> with
 * OUTBOX_DATABASES; into out, cut at outlen. */
void config_database_setting(const struct config *cfg, size_t d,
			     const char *base, char *out, size_t outlen);
/* The index of the database called name (len bytes), or -1. */
int config_database_index(const struct config *cfg, const char *name,
			  size_t len);

/* The most sources OUTBOX_METRICS_SOURCES may give series of their own. */
#define RELAY_METRICS_SOURCES_MAX 10000

/* The most tables OUTBOX_TABLE may list. */
#define CONFIG_TABLES_MAX 1000

/* True when OUTBOX_TABLE has a pattern (a schema with *). */
bool config_has_patterns(const struct config *cfg);
/* OUTBOX_TABLE's first table that is not a pattern; NULL when none. */
const char *config_first_table(const struct config *cfg);

struct config {
	/* Postgres */
	char *database_url; /* NULL: libpq's PG* variables apply */
	char *table;	    /* OUTBOX_TABLE as given */
	/* OUTBOX_DATABASES as given (NULL: one database) and its databases
	 * (n_databases of them, 0 without it): read them through
	 * config_database_url() and its siblings. */
	char *databases_list;
	struct config_database *databases;
	size_t n_databases;
	/* OUTBOX_TABLE's tables, "name" or "schema.name" each (at least
	 * one, none twice, at most CONFIG_TABLES_MAX): the relay's sources
	 * (docs/design.md §13). */
	char **tables;
	size_t n_tables;
	int64_t discovery_interval_ms; /* OUTBOX_DISCOVERY_INTERVAL */
	char *listen_database_url;     /* NULL: database_url */
	bool listen;
	enum config_pg_prepare pg_prepare;
	int64_t statement_timeout_ms; /* also the mark budget of §4 */
	int64_t pg_dead_peer_ms;      /* keepalive window, both ends */

	/* Publisher */
	char *publisher; /* a backend's name, as check_publisher accepts */

	/* CloudEvents */
	char *ce_source;
	enum config_ce_mode ce_mode;

	/* Loops */
	int batch_size;
	int64_t batch_bytes; /* payload bytes per lease, a budget */
	int workers;
	int worker_window; /* as set; 0: config_worker_window() decides */
	int64_t poll_interval_ms;
	int64_t lease_interval_ms; /* after a partial batch, lease start to
				      the next lease's start */
	int64_t lease_rescan_ms;   /* 0: every lease scans from the start */
	int64_t publish_timeout_ms;
	int64_t lease_timeout_ms;
	int64_t sweep_interval_ms;
	int64_t clean_interval_ms;
	int64_t retention_ms;
	int64_t failed_retention_ms; /* 0 keeps failed rows */
	int clean_batch_size;
	int64_t backoff_base_ms;
	int64_t backoff_max_ms;
	double backoff_factor;
	enum config_ordering ordering;
	enum config_on_failure on_failure;
	double max_rate;	/* events/s per replica, 0 = unlimited */
	int64_t max_event_size; /* bytes of an event; larger rows fail */
	int64_t shutdown_timeout_ms;

	/* Operations */
	char *http_addr;     /* "host:port"; empty disables HTTP */
	int metrics_sources; /* sources with series of their own */
	int log_level;	     /* enum log_level from log.h */
	enum config_log_format log_format;

	/* The settings groups of the extensions, in their order. */
	struct config_part parts[CONFIG_GROUPS_MAX];
	size_t n_parts;

	/* What config_load() found worth a warning but not a refusal (a
	 * NAME_FILE readable by everyone): lines ending in '\n', for the
	 * caller to log once logging is set up; "" when none. */
	char warnings[CONFIG_WARNINGS_MAX];
};

/*
 * Reads every setting of the core table and of ext's groups from the
 * environment (NAME, or the file named by NAME_FILE with one trailing
 * newline stripped), applies defaults, validates each value and the
 * cross-checks. ext may be NULL: the core settings only.
 *
 * On failure, writes one line per problem to errs (each naming the
 * variable, never a secret value) and returns the number of problems;
 * returns 0 on success. cfg is always safe to config_release().
 */
int config_load(struct config *cfg, const struct config_extensions *ext,
		FILE *errs);

/* The lanes per worker OUTBOX_WORKER_WINDOW means: as set, or for 0, 2
 * when there is one worker and 1 when there are several. */
int config_worker_window(const struct config *cfg);

/* Frees every string and group struct config_load() stored; leaves cfg
 * zeroed. */
void config_release(struct config *cfg);

/* The struct group's rows filled, or NULL when group was not loaded. */
void *config_part_of(const struct config *cfg,
		     const struct config_group *group);

/* Writes the settings reference (name, default, meaning) for --help. */
void config_print_help(FILE *out, const struct config_extensions *ext);

/* Writes the settings table as Markdown, for the README. */
void config_print_markdown(FILE *out, const struct config_extensions *ext);

/* Copies url into out with any password replaced by "***". */
void config_redact_url(const char *url, char *out, size_t outlen);

/*
 * The user and password of a "scheme://" URL must be unambiguous, so the
 * relay, libpq and librabbitmq all read the same password and no part of
 * it can end up in a host name, a port or an error message. They end at
 * the '@' before the first '/' (libpq's reading); there may be only one
 * such '@', and every '%' before it must start a %XX escape. Without an
 * '@' there, an '@' further on must follow a host list ("h:5432,h2/db?
 * application_name=a@b"), or it is a password holding a '/'; and an '@'
 * after a '?' needs a '/' before that '?'. Anything else is refused with
 * a way to write it (percent-encoding). Other strings (libpq key=value)
 * pass. 0, or -1 with why set, never quoting url.
 */
int config_url_userinfo_check(const char *url, char *why, size_t whylen);

/* True when name is a variable of the core table or of a group of ext
 * (with or without the _FILE suffix, or one of a group's prefix). */
bool config_knows(const struct config_extensions *ext, const char *name);

/*
 * For a group's hooks, while config_load() runs.
 */

/* Reads NAME, or the file named by NAME_FILE, into *out (caller frees).
 * Returns 1 when set, 2 when read from the file, 0 when neither is set,
 * -1 after reporting. */
int config_env_read(struct config_loader *ld, const char *name, char **out);

/* Reports one problem: "config: NAME: what (got 'value')". A secret's
 * value is never printed; value NULL prints no suffix. */
void config_problem(struct config_loader *ld, const char *name, bool secret,
		    const char *value, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* True when the setting called name was read without a problem. */
bool config_loader_ok(const struct config_loader *ld, const char *name);

/* 60000 -> "1m", 1500 -> "1500ms": durations as the settings write them. */
void config_format_duration(int64_t ms, char *buf, size_t len);

/* 16777216 -> "16MiB", 1000 -> "1000B": sizes as the settings write them. */
void config_format_size(int64_t bytes, char *buf, size_t len);

/* A whole decimal integer, nothing before or after it; -1 with why. */
int config_parse_int64(const char *s, int64_t *out, char *why, size_t whylen);

/* Frees s, wiping it first when it holds a secret. */
void config_free_secret(char *s, bool secret);

/* True when v holds a control character (C0 or DEL): such a value would
 * corrupt a log line or a header, so checks refuse it. */
bool config_has_control(const char *v);

/* True when the host (n bytes of host, which need not end there) stays
 * on this machine: empty, a Unix socket directory ('/' or '@'),
 * localhost, 127.0.0.0/8 or ::1. The links the relay warns about when
 * they run in plaintext are the others. */
bool config_host_is_local(const char *host, size_t n);

#endif
