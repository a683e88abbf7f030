/* SPDX-License-Identifier: MIT */
/*
 * The Kafka producer's configuration: every OUTBOX_KAFKA_<PROPERTY> the
 * operator set, then what the relay insists on (idempotence, acks=all)
 * and its defaults (message timeout inside the publish deadline, the
 * dead-peer window, client id). Errors name the variable, never a
 * secret value.
 */
#include "kafka.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backends.h"
#include "base/base.h"

#define VAR_PREFIX "OUTBOX_KAFKA_"
/* librdkafka's own default for topic.metadata.propagation.max.ms. */
#define PROPAGATION_DEFAULT_MS 30000

/* sasl.password -> OUTBOX_KAFKA_SASL_PASSWORD, the variable that set it. */
static void prop_var(const char *name, char *out, size_t outlen)
{
	size_t j = strlen(VAR_PREFIX);

	snprintf(out, outlen, "%s", VAR_PREFIX);
	for (size_t i = 0; name[i] && j + 1 < outlen; i++)
		out[j++] = name[i] == '.'
			       ? '_'
			       : (char)toupper((unsigned char)name[i]);
	out[j < outlen ? j : outlen - 1] = '\0';
}

/* Properties that would void what the relay promises. The settings table
 * already refuses enable.idempotence, acks and bootstrap.servers. */
static int prop_refused(const struct kafka_prop *p, char *err, size_t errlen)
{
	char var[300];

	prop_var(p->name, var, sizeof(var));
	if (strcmp(p->name, "delivery.report.only.error") == 0 &&
	    strcmp(p->value, "false") != 0) {
		snprintf(err, errlen,
			 "%s: the relay needs a delivery report for every "
			 "record to mark it sent; leave it unset or false",
			 var);
		return -1;
	}
	if (strcmp(p->name, "transactional.id") == 0) {
		snprintf(err, errlen,
			 "%s: the relay uses the idempotent producer, not "
			 "transactions; leave it unset",
			 var);
		return -1;
	}
	return 0;
}

static int conf_put(rd_kafka_conf_t *conf, const char *name, const char *value,
		    bool secret, char *err, size_t errlen)
{
	char why[512] = "";
	char var[300];
	rd_kafka_conf_res_t res;

	res = rd_kafka_conf_set(conf, name, value, why, sizeof(why));
	if (res == RD_KAFKA_CONF_OK)
		return 0;
	prop_var(name, var, sizeof(var));
	if (res == RD_KAFKA_CONF_UNKNOWN)
		snprintf(err, errlen, "%s: librdkafka %s has no property '%s'",
			 var, rd_kafka_version_str(), name);
	else if (secret)
		/* librdkafka's message quotes the value. */
		snprintf(err, errlen, "%s: invalid value for '%s' (not shown)",
			 var, name);
	else
		snprintf(err, errlen, "%s: %s", var, why);
	return -1;
}

/* Sets name to the relay's value unless a variable set it. */
static int conf_default(rd_kafka_conf_t *conf, const struct config *cfg,
			const char *name, const char *alias, const char *value,
			char *err, size_t errlen)
{
	if (kafka_prop_find(cfg, name) ||
	    (alias && kafka_prop_find(cfg, alias)))
		return 0;
	return conf_put(conf, name, value, false, err, errlen);
}

int64_t kafka_dead_peer_ms(const struct config *cfg)
{
	int64_t w = cfg->lease_timeout_ms / 4;
	return w < KAFKA_DEAD_PEER_MIN_MS   ? KAFKA_DEAD_PEER_MIN_MS
	       : w > KAFKA_DEAD_PEER_MAX_MS ? KAFKA_DEAD_PEER_MAX_MS
					    : w;
}

/*
 * A broker that went silent (a cut link, a half-open connection through a
 * load balancer) is given up within the dead-peer window, a quarter of the
 * lease as for AMQP's heartbeats, and the link is tried again soon after
 * it returns. librdkafka's own defaults (60 s for a request, 30 s to set
 * up a connection, reconnects backing off to 10 s) outlast a default
 * lease. Each stays settable as OUTBOX_KAFKA_<PROPERTY>.
 */
static int conf_dead_peer(rd_kafka_conf_t *conf, const struct config *cfg,
			  char *err, size_t errlen)
{
	int64_t w = kafka_dead_peer_ms(cfg);
	char window[32], backoff[32];

	snprintf(window, sizeof(window), "%" PRId64, w);
	snprintf(backoff, sizeof(backoff), "%" PRId64, w / 2);
	return conf_default(conf, cfg, "socket.timeout.ms", NULL, window, err,
			    errlen) ||
	       conf_default(conf, cfg, "socket.connection.setup.timeout.ms",
			    NULL, window, err, errlen) ||
	       conf_default(conf, cfg, "reconnect.backoff.max.ms",
			    "reconnect.backoff.ms", backoff, err, errlen) ||
	       conf_default(conf, cfg, "socket.keepalive.enable", NULL, "true",
			    err, errlen);
}

/*
 * The producer configuration: every OUTBOX_KAFKA_<PROPERTY>, then what the
 * relay insists on. Returns a conf owned by the caller, or NULL with err
 * naming the variable at fault (never a secret value).
 */
rd_kafka_conf_t *kafka_conf_build(const struct config *cfg, bool brokers,
				  char *err, size_t errlen)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char num[32];
	int64_t propagation;

	if (!conf) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < kafka_settings_of(cfg)->n_props; i++) {
		const struct kafka_prop *p = &kafka_settings_of(cfg)->props[i];

		if (prop_refused(p, err, errlen) != 0 ||
		    conf_put(conf, p->name, p->value, p->secret, err, errlen) !=
			0)
			goto fail;
	}
	/* Retries neither duplicate nor reorder, and an ack means every
	 * in-sync replica has the record (the settings table refuses other
	 * values, so these only restate them). */
	if (conf_put(conf, "enable.idempotence", "true", false, err, errlen) ||
	    conf_put(conf, "acks", "all", false, err, errlen))
		goto fail;
	/* No record may outlive the lease that sent it (docs/design.md §4);
	 * the settings table refuses a larger value. */
	snprintf(num, sizeof(num), "%" PRId64, cfg->publish_timeout_ms);
	if (conf_default(conf, cfg, "message.timeout.ms", "delivery.timeout.ms",
			 num, err, errlen))
		goto fail;
	if (conf_dead_peer(conf, cfg, err, errlen))
		goto fail;
	/* An unknown topic must be reported within the publish deadline so
	 * it pauses the topic instead of timing out like an outage. */
	propagation = cfg->publish_timeout_ms / 2;
	if (propagation > PROPAGATION_DEFAULT_MS)
		propagation = PROPAGATION_DEFAULT_MS;
	snprintf(num, sizeof(num), "%" PRId64, propagation);
	if (conf_default(conf, cfg, "topic.metadata.propagation.max.ms", NULL,
			 num, err, errlen) ||
	    conf_default(conf, cfg, "client.id", NULL, "outbox-relay", err,
			 errlen))
		goto fail;
	if (brokers &&
	    conf_put(conf, "bootstrap.servers", kafka_settings_of(cfg)->brokers,
		     false, err, errlen))
		goto fail;
	return conf;
fail:
	rd_kafka_conf_destroy(conf);
	return NULL;
}
