/* SPDX-License-Identifier: MIT */
/* The table of publisher backends and lookups by configuration. */
#include "publisher.h"

#include <string.h>

#include "backends.h"

const struct publisher_ops *const publisher_registry[] = {
    &publisher_stdout,
    &publisher_amqp,
    &publisher_kafka,
    NULL,
};

/* A test program may link extra backends in by defining this table (the
 * production binary does not, so the weak reference stays NULL). */
extern const struct publisher_ops *const publisher_test_registry[]
    __attribute__((weak));

const struct publisher_ops *publisher_find(const char *name)
{
	if (!name)
		return NULL;
	for (size_t i = 0; publisher_registry[i]; i++)
		if (strcmp(publisher_registry[i]->name, name) == 0)
			return publisher_registry[i];
	if (publisher_test_registry)
		for (size_t i = 0; publisher_test_registry[i]; i++)
			if (strcmp(publisher_test_registry[i]->name, name) == 0)
				return publisher_test_registry[i];
	return NULL;
}

const char *publisher_default_destination(const struct config *cfg)
{
	const char *dest = NULL;

	if (!cfg->publisher)
		return "";
	if (strcmp(cfg->publisher, "amqp") == 0)
		dest = cfg->amqp_exchange;
	else if (strcmp(cfg->publisher, "kafka") == 0)
		dest = cfg->kafka_topic;
	return dest ? dest : "";
}
