/* SPDX-License-Identifier: MIT */
/*
 * The Kafka backend's settings: OUTBOX_KAFKA_BROKERS, _TOPIC, _KEY_FROM
 * and every other OUTBOX_KAFKA_<PROPERTY> passed through to librdkafka,
 * refusing the properties that would void the relay's guarantees; and
 * the topic name rule, which the mapping (kafka_map.c) uses too. Below
 * the mapping: nothing here calls into it.
 */
#include "kafka.h"

#include <ctype.h>
#include <strings.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define S struct kafka_settings
#define KAFKA_PREFIX "OUTBOX_KAFKA_"

/* SET_ENUM rows store the index of the choice: keep the orders equal. */
_Static_assert(KEY_FROM_PARTITION_KEY == 0 && KEY_FROM_ROUTING_KEY == 1,
	       "choices");

static const char *const key_from_choices[] = {"partition_key", "routing_key",
					       NULL};

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
	if (config_has_control(v)) {
		snprintf(why, whylen, "contains control characters");
		return -1;
	}
	return 0;
}

/* The topic rule of OUTBOX_KAFKA_TOPIC, kept here for the mapping too
 * (kafka_map.c checks each row's topic with it), so the settings need
 * nothing from the files above them. */
bool kafka_topic_valid(const char *name)
{
	size_t n = name ? strlen(name) : 0;

	if (n == 0 || n > 249 || strcmp(name, ".") == 0 ||
	    strcmp(name, "..") == 0)
		return false;
	return name[strspn(name, "abcdefghijklmnopqrstuvwxyz"
				 "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
				 "0123456789._-")] == '\0';
}

static int check_topic(const char *v, char *why, size_t whylen)
{
	if (!kafka_topic_valid(v)) {
		snprintf(why, whylen,
			 "must be a Kafka topic name: 1 to 249 of "
			 "[A-Za-z0-9._-], not . or ..");
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
static void kafka_prop_check(struct config_loader *ld, const char *var,
			     const struct kafka_prop *p,
			     const struct config *cfg, bool publish_ok)
{
	char budget[32];
	int64_t ms;
	char why[128];

	if (strcmp(p->name, "enable.idempotence") == 0 &&
	    strcmp(p->value, "true") != 0) {
		config_problem(
		    ld, var, p->secret, p->value,
		    "the relay requires enable.idempotence=true so "
		    "retries neither duplicate nor reorder messages");
	} else if ((strcmp(p->name, "acks") == 0 ||
		    strcmp(p->name, "request.required.acks") == 0) &&
		   strcmp(p->value, "all") != 0 &&
		   strcmp(p->value, "-1") != 0) {
		config_problem(
		    ld, var, p->secret, p->value,
		    "the relay requires %s=all (or -1) so an ack means "
		    "every in-sync replica has the message",
		    p->name);
	} else if (strcmp(p->name, "bootstrap.servers") == 0 ||
		   strcmp(p->name, "metadata.broker.list") == 0) {
		config_problem(ld, var, false, NULL,
			       "set the brokers with OUTBOX_KAFKA_BROKERS");
	} else if (strcmp(p->name, "message.timeout.ms") == 0 ||
		   strcmp(p->name, "delivery.timeout.ms") == 0) {
		if (config_parse_int64(p->value, &ms, why, sizeof(why)) != 0 ||
		    ms < 1) {
			config_problem(ld, var, p->secret, p->value,
				       "%s must be a positive whole number of "
				       "milliseconds (0 would never time out)",
				       p->name);
		} else if (publish_ok && ms > cfg->publish_timeout_ms) {
			config_format_duration(cfg->publish_timeout_ms, budget,
					       sizeof(budget));
			config_problem(
			    ld, var, p->secret, p->value,
			    "%s must not exceed OUTBOX_PUBLISH_TIMEOUT "
			    "(%s = %" PRId64 " ms) so no message "
			    "outlives its lease",
			    p->name, budget, cfg->publish_timeout_ms);
		}
	}
}

static int kafka_prop_cmp(const void *a, const void *b)
{
	const struct kafka_prop *pa = a, *pb = b;
	return strcmp(pa->name, pb->name);
}

/* One OUTBOX_KAFKA_<PROPERTY> variable (var without _FILE). */
static void kafka_prop_load(struct config_loader *ld, const struct config *cfg,
			    const char *var, void *data)
{
	struct kafka_settings *ks = data;
	bool publish_ok = config_loader_ok(ld, "OUTBOX_PUBLISH_TIMEOUT");
	const char *rest = var + strlen(KAFKA_PREFIX);
	struct kafka_prop prop = {0};
	struct kafka_prop *grown;
	char *value = NULL;
	int rc;

	rc = kafka_prop_name(rest, strlen(rest), &prop.name);
	if (rc == -2) {
		config_problem(ld, var, false, NULL, "out of memory");
		goto out;
	}
	if (rc != 0) {
		config_problem(
		    ld, var, false, NULL,
		    "not a librdkafka property: OUTBOX_KAFKA_ must be "
		    "followed by the property name with dots written as "
		    "single underscores");
		goto out;
	}
	prop.secret = kafka_prop_secret(prop.name);
	int got = config_env_read(ld, var, &value);
	if (got <= 0)
		goto out;
	/* A value from a file is never echoed (config_env_read()). */
	prop.secret |= got == 2;
	for (size_t i = 0; i < ks->n_props; i++) {
		if (strcmp(ks->props[i].name, prop.name) == 0) {
			config_problem(ld, var, false, NULL,
				       "property '%s' is set by more than one "
				       "variable",
				       prop.name);
			goto out;
		}
	}
	prop.value = value;
	kafka_prop_check(ld, var, &prop, cfg, publish_ok);
	grown = realloc(ks->props, (ks->n_props + 1) * sizeof(*grown));
	if (!grown) {
		config_problem(ld, var, false, NULL, "out of memory");
		goto out;
	}
	ks->props = grown;
	ks->props[ks->n_props++] = prop;
	/* Sorted by name, so a property is found the same way however the
	 * environment happens to be ordered. */
	qsort(ks->props, ks->n_props, sizeof(ks->props[0]), kafka_prop_cmp);
	prop.name = NULL;
	value = NULL;
out:
	free(prop.name);
	config_free_secret(value, prop.secret);
}

static void kafka_settings_release(void *data)
{
	struct kafka_settings *ks = data;

	for (size_t i = 0; i < ks->n_props; i++) {
		free(ks->props[i].name);
		config_free_secret(ks->props[i].value, ks->props[i].secret);
	}
	free(ks->props);
	ks->props = NULL;
	ks->n_props = 0;
}

static const struct setting kafka_rows[] = {
    SETTING_STRING(S, "OUTBOX_KAFKA_BROKERS", brokers, "127.0.0.1:9092",
		   check_brokers, 0, "Kafka bootstrap brokers, host:port,..."),
    SETTING_STRING(S, "OUTBOX_KAFKA_TOPIC", topic, "outbox", check_topic, 0,
		   "topic for rows whose exchange is NULL"),
    SETTING_ENUM(S, "OUTBOX_KAFKA_KEY_FROM", key_from, "partition_key",
		 key_from_choices, NULL,
		 "row column used as the Kafka message key"),
};

const struct config_group kafka_settings_group = {
    .rows = kafka_rows,
    .n_rows = ARRAY_SIZE(kafka_rows),
    .size = sizeof(struct kafka_settings),
    .prefix = KAFKA_PREFIX,
    .load_extra = kafka_prop_load,
    .release = kafka_settings_release,
    .prefix_help =
	"  OUTBOX_KAFKA_<PROPERTY>\n      any librdkafka property, "
	"lower-cased with underscores as dots\n      "
	"(OUTBOX_KAFKA_SASL_MECHANISM=PLAIN -> sasl.mechanism); "
	"passwords,\n      secrets and PEM values are never logged\n",
    .prefix_markdown =
	"| `OUTBOX_KAFKA_<PROPERTY>` | unset | any librdkafka "
	"property, lower-cased with underscores as dots "
	"(`OUTBOX_KAFKA_SASL_MECHANISM` sets `sasl.mechanism`); "
	"`enable.idempotence` must stay `true` and `acks` `all` |\n",
};

const struct kafka_settings *kafka_settings_of(const struct config *cfg)
{
	static const struct kafka_settings none;
	const struct kafka_settings *s =
	    config_part_of(cfg, &kafka_settings_group);

	return s ? s : &none;
}

const struct kafka_prop *kafka_prop_find(const struct config *cfg,
					 const char *name)
{
	const struct kafka_settings *ks = kafka_settings_of(cfg);

	for (size_t i = 0; i < ks->n_props; i++)
		if (strcmp(ks->props[i].name, name) == 0)
			return &ks->props[i];
	return NULL;
}

static const char *prop_value(const struct config *cfg, const char *name)
{
	const struct kafka_prop *p = kafka_prop_find(cfg, name);

	return p ? p->value : NULL;
}

/* The brokers of OUTBOX_KAFKA_BROKERS that are not loopback, into out. */
static bool remote_brokers(const char *list, char *out, size_t len)
{
	size_t used = 0;
	bool any = false;

	out[0] = '\0';
	for (const char *p = list ? list : ""; *p;) {
		size_t n = strcspn(p, ","), hlen;
		const char *h = p, *scheme, *colon;

		while (n > 0 && (*h == ' ' || *h == '\t')) {
			h++;
			n--;
		}
		scheme = memmem(h, n, "://", 3);
		if (scheme) {
			n -= (size_t)(scheme + 3 - h);
			h = scheme + 3;
		}
		/* host:port, or [v6]:port */
		colon = memrchr(h, ':', n);
		hlen = colon && (h[0] != '[' || colon[-1] == ']')
			   ? (size_t)(colon - h)
			   : n;
		if (hlen >= 2 && h[0] == '[') {
			h++;
			hlen -= 2;
		}
		if (!config_host_is_local(h, hlen)) {
			int w = snprintf(out + used, len - used, "%s%.*s",
					 any ? "," : "", (int)hlen, h);
			if (w > 0 && (size_t)w < len - used)
				used += (size_t)w;
			any = true;
		}
		p += strcspn(p, ",");
		p += *p == ',';
	}
	return any;
}

void kafka_settings_warn(const struct config *cfg)
{
	const struct kafka_settings *ks = kafka_settings_of(cfg);
	const char *proto = prop_value(cfg, "security.protocol");
	const char *verify =
	    prop_value(cfg, "enable.ssl.certificate.verification");
	bool tls = proto && (strcasecmp(proto, "ssl") == 0 ||
			     strcasecmp(proto, "sasl_ssl") == 0);
	char hosts[512];

	if (tls && verify && strcasecmp(verify, "false") == 0)
		log_fields(LOG_WARN,
			   "kafka: TLS certificate verification is off "
			   "(enable.ssl.certificate.verification=false): "
			   "anyone on the path can pose as the brokers",
			   "link", "kafka", NULL);
	else if (!tls && remote_brokers(ks->brokers, hosts, sizeof(hosts)))
		log_fields(LOG_WARN,
			   "kafka: plaintext link to brokers that are not "
			   "loopback (security.protocol is not ssl or "
			   "sasl_ssl): events and any SASL password cross the "
			   "network unencrypted",
			   "link", "kafka", "brokers", hosts, NULL);
}
