/* SPDX-License-Identifier: MIT */
/* The AMQP backend's settings: OUTBOX_AMQP_* and OUTBOX_UNROUTABLE. */
#include "amqp_map.h"

#include <stdlib.h>
#include <string.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define S struct amqp_settings

/* SET_ENUM rows store the index of the choice: keep the orders equal. */
_Static_assert(UNROUTABLE_RETRY == 0 && UNROUTABLE_FAIL == 1, "choices");

static const char *const header_prefix_choices[] = {"ce-", "cloudEvents_",
						    NULL};
static const char *const unroutable_choices[] = {"retry", "fail", NULL};

int amqp_url_check(const char *url, char *why, size_t whylen)
{
	struct amqp_connection_info info;
	char *copy = strdup(url);
	int ret = -1;

	if (!copy) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	amqp_default_connection_info(&info);
	if (config_url_userinfo_check(url, why, whylen) != 0)
		goto out; /* why says how to write it */
	if (amqp_parse_url(copy, &info) != AMQP_STATUS_OK)
		snprintf(why, whylen,
			 "not an AMQP URL "
			 "(amqp://user:password@host:port/vhost or amqps://; "
			 "percent-encode ':', '@', '/', '?', '#' and '%%' in "
			 "the user and password)");
	else if (info.vhost[0] == '\0')
		/* "amqp://host/" names the vhost "", which brokers refuse. */
		snprintf(why, whylen,
			 "empty virtual host: drop the trailing '/' for "
			 "vhost '/', or write it as %%2f");
	else
		ret = 0;
out:
	explicit_bzero(copy, strlen(url));
	free(copy);
	return ret;
}

static int check_exchange(const char *v, char *why, size_t whylen)
{
	if (strlen(v) > 255 || config_has_control(v)) {
		snprintf(why, whylen,
			 "must be at most 255 bytes without control "
			 "characters");
		return -1;
	}
	return 0;
}

static const struct setting amqp_rows[] = {
    SETTING_STRING(S, "OUTBOX_AMQP_URL", url,
		   "amqp://guest:guest@127.0.0.1:5672", amqp_url_check,
		   SETTING_SECRET,
		   "broker URL, amqp://user:password@host:port/vhost or "
		   "amqps:// for TLS; no path means vhost /"),
    SETTING_STRING(S, "OUTBOX_AMQP_EXCHANGE", exchange, "", check_exchange, 0,
		   "exchange for rows whose exchange is NULL; empty is the "
		   "default exchange"),
    SETTING_BOOL(S, "OUTBOX_AMQP_DECLARE_EXCHANGE", declare_exchange, "off",
		 "declare OUTBOX_AMQP_EXCHANGE when connecting"),
    SETTING_WORD(S, "OUTBOX_AMQP_HEADER_PREFIX", header_prefix, "ce-",
		 header_prefix_choices, "prefix of CloudEvents AMQP headers"),
    SETTING_ENUM(S, "OUTBOX_UNROUTABLE", unroutable, "retry",
		 unroutable_choices, NULL,
		 "what an unroutable (returned) AMQP message does to its row: "
		 "retry pauses the destination, fail fails the row"),
};

const struct config_group amqp_settings_group = {
    .rows = amqp_rows,
    .n_rows = ARRAY_SIZE(amqp_rows),
    .size = sizeof(struct amqp_settings),
};

const struct amqp_settings *amqp_settings(const struct config *cfg)
{
	static const struct amqp_settings none;
	const struct amqp_settings *s = config_part(cfg, &amqp_settings_group);

	return s ? s : &none;
}
