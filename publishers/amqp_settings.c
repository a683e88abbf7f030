/* SPDX-License-Identifier: MIT */
/* The AMQP backend's settings: OUTBOX_AMQP_* and OUTBOX_UNROUTABLE. */
#include "amqp_map.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define S struct rmq_settings

/* SET_ENUM rows store the index of the choice: keep the orders equal. */
_Static_assert(UNROUTABLE_RETRY == 0 && UNROUTABLE_FAIL == 1, "choices");
_Static_assert(RMQ_SASL_PLAIN == 0 && RMQ_SASL_EXTERNAL == 1, "choices");

static const char *const header_prefix_choices[] = {"ce-", "cloudEvents_",
						    NULL};
static const char *const unroutable_choices[] = {"retry", "fail", NULL};
static const char *const sasl_choices[] = {"plain", "external", NULL};

int rmq_url_check(const char *url, char *why, size_t whylen)
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

/* A PEM file the TLS socket will load: readable now, so a wrong path
 * stops startup instead of failing every connect. */
static int check_pem_file(const char *v, char *why, size_t whylen)
{
	char msg[96];

	if (config_has_control(v)) {
		snprintf(why, whylen, "contains control characters");
		return -1;
	}
	/* Opened without blocking, so a FIFO cannot hang startup; a
	 * directory (the CA path mistaken for a bundle) or a device would
	 * only fail at each connect. */
	int fd = open(v, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		snprintf(why, whylen, "cannot read the file: %s",
			 strerror_r(errno, msg, sizeof(msg)));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	close(fd);
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, whylen, "is not a regular file (%s)",
			 S_ISDIR(st.st_mode) ? "a directory" : "not a file");
		return -1;
	}
	return 0;
}

static const struct setting rmq_rows[] = {
    SETTING_STRING(S, "OUTBOX_AMQP_URL", url,
		   "amqp://guest:guest@127.0.0.1:5672", rmq_url_check,
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
    SETTING_STRING(S, "OUTBOX_AMQP_TLS_CA", tls_ca_file, NULL, check_pem_file,
		   SETTING_NULLABLE,
		   "path of a PEM file of the CAs amqps:// trusts for the "
		   "broker's certificate; unset uses the system's CA bundle"),
    SETTING_STRING(S, "OUTBOX_AMQP_TLS_CERT", tls_cert_file, NULL,
		   check_pem_file, SETTING_NULLABLE,
		   "path of the PEM client certificate (chain) amqps:// "
		   "presents; needs OUTBOX_AMQP_TLS_KEY"),
    SETTING_STRING(S, "OUTBOX_AMQP_TLS_KEY", tls_key_file, NULL, check_pem_file,
		   SETTING_NULLABLE,
		   "path of the PEM private key (unencrypted) of "
		   "OUTBOX_AMQP_TLS_CERT"),
    SETTING_BOOL(S, "OUTBOX_AMQP_TLS_VERIFY", tls_verify, "on",
		 "verify the broker's certificate and host name (amqps://); "
		 "off is logged as a warning at startup"),
    SETTING_ENUM(S, "OUTBOX_AMQP_SASL_MECHANISM", sasl, "plain", sasl_choices,
		 NULL,
		 "login: plain sends the URL's user and password, external "
		 "the TLS client certificate (broker plugin "
		 "rabbitmq_auth_mechanism_ssl)"),
    SETTING_DURATION(S, "OUTBOX_AMQP_HEARTBEAT", heartbeat_ms, "10s",
		     SETTING_SECOND, 10 * SETTING_MINUTE, 0,
		     "AMQP heartbeat the relay proposes, whole seconds (the "
		     "connection takes the lower of it and the broker's); two "
		     "missed ones end a silent link; at most a quarter of the "
		     "lease timeout is used"),
};

/* ci of url, parsed into copy (freed by the caller); -1 when not a URL. */
static int url_info(const char *url, char **copy,
		    struct amqp_connection_info *ci)
{
	*copy = strdup(url);
	if (!*copy)
		return -1;
	amqp_default_connection_info(ci);
	return amqp_parse_url(*copy, ci) == AMQP_STATUS_OK ? 0 : -1;
}

/* The copy's length is the URL's: amqp_parse_url() cut it with NULs, and
 * the password lies past the first. */
static void url_free(char *copy, const char *url)
{
	if (copy) {
		explicit_bzero(copy, strlen(url));
		free(copy);
	}
}

int rmq_settings_check(const struct rmq_settings *as, char *err, size_t errlen)
{
	struct amqp_connection_info ci;
	char *copy = NULL;
	int ret = -1;

	if (!as->url || url_info(as->url, &copy, &ci) != 0) {
		snprintf(err, errlen, "OUTBOX_AMQP_URL: not an AMQP URL");
		goto out;
	}
	if (!ci.ssl && (as->tls_ca_file || as->tls_cert_file ||
			as->tls_key_file || !as->tls_verify)) {
		snprintf(err, errlen,
			 "OUTBOX_AMQP_TLS_* apply to TLS only, but "
			 "OUTBOX_AMQP_URL is amqp://: use amqps://");
		goto out;
	}
	if (!as->tls_cert_file != !as->tls_key_file) {
		snprintf(err, errlen,
			 "OUTBOX_AMQP_TLS_CERT and "
			 "OUTBOX_AMQP_TLS_KEY go together: set both "
			 "or neither");
		goto out;
	}
	if (as->heartbeat_ms % 1000 != 0) {
		snprintf(err, errlen,
			 "OUTBOX_AMQP_HEARTBEAT: AMQP heartbeats are whole "
			 "seconds");
		goto out;
	}
	if (as->sasl == RMQ_SASL_EXTERNAL && (!ci.ssl || !as->tls_cert_file)) {
		snprintf(err, errlen,
			 "OUTBOX_AMQP_SASL_MECHANISM=external logs in with the "
			 "TLS client certificate: it needs an amqps:// URL and "
			 "OUTBOX_AMQP_TLS_CERT with OUTBOX_AMQP_TLS_KEY");
		goto out;
	}
	ret = 0;
out:
	url_free(copy, as->url);
	return ret;
}

void rmq_settings_warn(const struct rmq_settings *as)
{
	struct amqp_connection_info ci;
	char *copy = NULL;
	char where[300];

	if (!as->url || url_info(as->url, &copy, &ci) != 0)
		goto out;
	snprintf(where, sizeof(where), "%s:%d", ci.host, ci.port);
	if (ci.ssl && !as->tls_verify)
		log_fields(LOG_WARN,
			   "amqp: TLS verification is off "
			   "(OUTBOX_AMQP_TLS_VERIFY=off): anyone on the path "
			   "can pose as the broker",
			   "link", "amqp", "broker", where, NULL);
	else if (!ci.ssl && !config_host_is_local(ci.host, strlen(ci.host)))
		log_fields(LOG_WARN,
			   "amqp: plaintext link to a host that is not "
			   "loopback: the password and every event cross "
			   "the network unencrypted; use amqps://",
			   "link", "amqp", "broker", where, NULL);
out:
	url_free(copy, as->url);
}

const struct config_group rmq_settings_group = {
    .rows = rmq_rows,
    .n_rows = ARRAY_SIZE(rmq_rows),
    .size = sizeof(struct rmq_settings),
};

const struct rmq_settings *rmq_settings_of(const struct config *cfg)
{
	static const struct rmq_settings none;
	const struct rmq_settings *s = config_part_of(cfg, &rmq_settings_group);

	return s ? s : &none;
}
