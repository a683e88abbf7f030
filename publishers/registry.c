/* SPDX-License-Identifier: MIT */
/* The table of publisher backends and lookups by configuration. */
#include "publisher.h"

#include <stdio.h>
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
	const struct publisher_ops *ops = publisher_find(cfg->publisher);
	const char *dest = NULL;

	if (ops && ops->default_destination)
		dest = ops->default_destination(cfg);
	return dest ? dest : "";
}

/* The registry is the one list of publishers. */
static int check_publisher(const char *v, char *why, size_t whylen)
{
	size_t used;

	if (publisher_find(v))
		return 0;
	used = (size_t)snprintf(why, whylen, "unknown backend; one of");
	for (size_t i = 0; publisher_registry[i] && used < whylen; i++)
		used +=
		    (size_t)snprintf(why + used, whylen - used, "%s %s",
				     i ? "," : "", publisher_registry[i]->name);
	return -1;
}

/* Appends the settings of the backends in table to groups. */
static size_t add_groups(const struct publisher_ops *const *table,
			 const struct config_group **groups, size_t n,
			 size_t max)
{
	for (size_t i = 0; table[i] && n < max; i++)
		if (table[i]->settings)
			groups[n++] = table[i]->settings;
	return n;
}

/* "publisher backend: stdout, amqp or kafka", from the registry (test
 * backends stay out of the documentation). */
static const char *publisher_help(void)
{
	static char help[256];
	size_t used =
	    (size_t)snprintf(help, sizeof(help), "publisher backend:");

	for (size_t i = 0; publisher_registry[i] && used < sizeof(help); i++) {
		const char *sep = i == 0		      ? " "
				  : publisher_registry[i + 1] ? ", "
							      : " or ";
		used +=
		    (size_t)snprintf(help + used, sizeof(help) - used, "%s%s",
				     sep, publisher_registry[i]->name);
	}
	return help;
}

void publisher_config_extensions(struct config_extensions *ext)
{
	static const struct config_group *groups[CONFIG_GROUPS_MAX + 1];
	size_t n = add_groups(publisher_registry, groups, 0, CONFIG_GROUPS_MAX);

	if (publisher_test_registry)
		n = add_groups(publisher_test_registry, groups, n,
			       CONFIG_GROUPS_MAX);
	groups[n] = NULL;
	*ext = (struct config_extensions){
	    .groups = groups,
	    .check_publisher = check_publisher,
	    .publisher_help = publisher_help(),
	};
}
