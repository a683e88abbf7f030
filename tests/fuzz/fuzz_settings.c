/* SPDX-License-Identifier: MIT */
/*
 * Settings parsing: the first byte picks a variable, the rest (up to a
 * NUL) is its value; config_load() parses and validates it as at startup
 * (durations, sizes, enums, URLs and their libpq/librabbitmq checks, the
 * Kafka passthrough). The value also goes through the URL redaction, the
 * URL userinfo check and the URI-reference check. Oracle: a URL whose
 * user and password the check accepts, holding a password, is redacted
 * with ":***@".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "encode/encode.h"
#include "fuzz_common.h"
#include "publishers/publisher.h"
#include "store/store.h"

static const char *const vars[] = {
    "OUTBOX_DATABASE_URL",
    "OUTBOX_LISTEN_DATABASE_URL",
    "OUTBOX_AMQP_URL",
    "OUTBOX_CE_SOURCE",
    "OUTBOX_POLL_INTERVAL",
    "OUTBOX_LEASE_TIMEOUT",
    "OUTBOX_FAILED_RETENTION",
    "OUTBOX_BATCH_SIZE",
    "OUTBOX_BACKOFF_FACTOR",
    "OUTBOX_MAX_RATE",
    "OUTBOX_TABLE",
    "OUTBOX_HTTP_ADDR",
    "OUTBOX_CE_MODE",
    "OUTBOX_LISTEN",
    "OUTBOX_AMQP_EXCHANGE",
    "OUTBOX_KAFKA_BROKERS",
    "OUTBOX_KAFKA_TOPIC",
    "OUTBOX_KAFKA_MESSAGE_TIMEOUT_MS",
    "OUTBOX_KAFKA_SASL_PASSWORD",
    "OUTBOX_LOG_LEVEL",
};
#define N_VARS (sizeof(vars) / sizeof(vars[0]))

static FILE *devnull;
static struct config_extensions ext;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	devnull = fopen("/dev/null", "w");
	if (!devnull)
		abort();
	publisher_config_extensions(&ext);
	ext.check_conninfo = store_conninfo_check;
	ext.check_ce_source = cloudevent_source_check;
	return 0;
}

/* "scheme://user:password@..." as the userinfo check reads it: true when
 * a ':' stands before the '@' ending the user and password. */
static int has_password(const char *v)
{
	const char *sep = strstr(v, "://");
	const char *auth, *at;
	size_t end;

	if (!sep)
		return 0;
	auth = sep + 3;
	end = strcspn(auth, "/?");
	at = memchr(auth, '@', end);
	return at && memchr(auth, ':', (size_t)(at - auth)) != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_fields f;
	struct config cfg;
	char out[512], why[256];
	const char *var, *value;

	if (size < 1)
		return 0;
	var = vars[data[0] % N_VARS];
	fuzz_split(data + 1, size - 1, 1, &f);
	value = f.field[0];

	/* The pure functions on the value. */
	config_redact_url(value, out, sizeof(out));
	if (strlen(value) < 200 && strncmp(value, "postgresql://", 13) == 0 &&
	    config_url_userinfo_check(value, why, sizeof(why)) == 0 &&
	    has_password(value) && !strstr(out, ":***@"))
		abort(); /* a password left in a redacted URL */
	config_url_userinfo_check(value, why, sizeof(why));
	cloudevent_uri_reference_problem(value, why, sizeof(why));
	cloudevent_source_check(value, why, sizeof(why));

	/* The whole loader, as at startup. */
	if (setenv(var, value, 1) == 0) {
		config_load(&cfg, &ext, devnull);
		config_release(&cfg);
		unsetenv(var);
	}
	fuzz_fields_free(&f);
	return 0;
}
