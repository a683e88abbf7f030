/* SPDX-License-Identifier: MIT */
/*
 * Settings: one table drives parsing from the environment (and NAME_FILE),
 * validation, the cross-checks of the contract's section 4, --help and the
 * README's settings table.
 *
 * Ownership: config_load() fills a struct config whose strings it owns;
 * config_release() frees them. After startup the struct is read-only and
 * shared by every thread without locking.
 */
#ifndef OUTBOX_CONFIG_H
#define OUTBOX_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum config_unroutable { UNROUTABLE_RETRY, UNROUTABLE_FAIL };
enum config_key_from { KEY_FROM_PARTITION_KEY, KEY_FROM_ROUTING_KEY };
enum config_ce_mode { CE_MODE_BINARY, CE_MODE_STRUCTURED };
enum config_ordering { ORDERING_NONE, ORDERING_PARTITION };
enum config_on_failure { ON_FAILURE_SKIP, ON_FAILURE_BLOCK };
enum config_log_format { LOG_FORMAT_JSON, LOG_FORMAT_TEXT };

/* One librdkafka property passed through OUTBOX_KAFKA_<PROPERTY>. */
struct config_kafka_prop {
	char *name;  /* dotted, lower case: "sasl.mechanism" */
	char *value; /* as given */
	bool secret; /* value never printed */
};

struct config {
	/* Postgres */
	char *database_url;	   /* NULL: libpq's PG* variables apply */
	char *table;		   /* "outbox_events" or "schema.table" */
	char *listen_database_url; /* NULL: database_url */
	bool listen;
	bool pg_prepare;
	int64_t statement_timeout_ms; /* also the mark budget of section 4 */

	/* Publisher */
	char *publisher; /* "stdout", "amqp" or "kafka" */
	char *amqp_url;
	char *amqp_exchange;	    /* default exchange for rows with NULL */
	bool amqp_declare_exchange; /* declare amqp_exchange at open */
	char *amqp_header_prefix;   /* "ce-" (default) or "cloudEvents_" */
	enum config_unroutable unroutable;
	char *kafka_brokers;
	char *kafka_topic; /* default topic for rows with NULL */
	enum config_key_from kafka_key_from;
	struct config_kafka_prop *kafka_props;
	size_t n_kafka_props;

	/* CloudEvents */
	char *ce_source;
	enum config_ce_mode ce_mode;

	/* Loops */
	int batch_size;
	int workers;
	int64_t poll_interval_ms;
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
	double max_rate; /* events/s per replica, 0 = unlimited */
	int64_t shutdown_timeout_ms;

	/* Operations */
	char *http_addr; /* "host:port"; empty disables HTTP */
	int log_level;	 /* enum log_level from log.h */
	enum config_log_format log_format;
};

/*
 * Reads every setting from the environment (NAME, or the file named by
 * NAME_FILE with one trailing newline stripped), applies defaults,
 * validates each value and the cross-checks.
 *
 * On failure, writes one line per problem to errs (each naming the
 * variable, never a secret value) and returns the number of problems;
 * returns 0 on success. cfg is always safe to config_release().
 */
int config_load(struct config *cfg, FILE *errs);

/* Frees every string config_load() stored; leaves cfg zeroed. */
void config_release(struct config *cfg);

/* Writes the settings reference (name, default, meaning) for --help. */
void config_print_help(FILE *out);

/* Writes the settings table as Markdown, for the README. */
void config_print_markdown(FILE *out);

/* Copies url into out with any password replaced by "***". */
void config_redact_url(const char *url, char *out, size_t outlen);

/* True when name is a variable the settings table knows (with or
 * without the _FILE suffix, and OUTBOX_KAFKA_<PROPERTY> passthrough). */
bool config_knows(const char *name);

#endif
