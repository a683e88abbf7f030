/* SPDX-License-Identifier: MIT */
/*
 * The links to Postgres and the brokers: which hosts count as loopback,
 * when a link may run in plaintext and is warned about (one line per
 * link, naming hosts, never a secret), and the AMQP TLS settings with
 * their cross-checks. No service needed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "capture.h"
#include "config/config.h"
#include "publishers/amqp_map.h"
#include "publishers/kafka.h"
#include "publishers/publisher.h"
#include "store/store.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

static void test_host_is_local(void **state)
{
	static const char *const local[] = {
	    "",		  "localhost",	    "LOCALHOST",
	    "localhost.", "127.0.0.1",	    "127.1.2.3",
	    "::1",	  "[::1]",	    "/var/run/postgresql",
	    "@abstract",  "0:0:0:0:0:0:0:1"};
	static const char *const remote[] = {
	    "db",	 "10.0.0.1", "127.example.com", "localhost.example",
	    "128.0.0.1", "::2",	     "[2001:db8::1]",	"0.0.0.0",
	    "localhos"};

	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(local); i++)
		if (!config_host_is_local(local[i], strlen(local[i])))
			fail_msg("'%s' should be local", local[i]);
	for (size_t i = 0; i < ARRAY_SIZE(remote); i++)
		if (config_host_is_local(remote[i], strlen(remote[i])))
			fail_msg("'%s' should not be local", remote[i]);
	/* Only the n bytes given count. */
	assert_true(config_host_is_local("127.0.0.1,db", 9));
	assert_false(config_host_is_local("db,127.0.0.1", 2));
}

struct pg_case {
	const char *conninfo;
	bool plaintext;
	const char *hosts;
};

static void test_postgres_plaintext(void **state)
{
	static const struct pg_case cases[] = {
	    {"postgresql://u:secret@db.example:5432/app", true, "db.example"},
	    {"postgresql://u:secret@db.example/app?sslmode=prefer", true,
	     "db.example"},
	    {"postgresql://u:secret@db.example/app?sslmode=disable", true,
	     "db.example"},
	    {"postgresql://u:secret@db.example/app?sslmode=require", false, ""},
	    {"postgresql://u:secret@db.example/app?sslmode=verify-ca", false,
	     ""},
	    {"postgresql://u:secret@db.example/app?sslmode=verify-full", false,
	     ""},
	    {"postgresql://u:secret@127.0.0.1:5432/app", false, ""},
	    {"postgresql://u:secret@localhost/app", false, ""},
	    {"host=/var/run/postgresql dbname=app", false, ""},
	    {"host=127.0.0.1,10.0.0.2,db2 password=secret", true,
	     "10.0.0.2,db2"},
	    {"host=db.example hostaddr=127.0.0.1 dbname=app", false, ""},
	    {"host=localhost hostaddr=10.1.1.1", true, "10.1.1.1"},
	    {"postgresql://u:secret@h1:5432,h2:5433/db", true, "h1,h2"},
	    {"not a conninfo ' at all", false, ""},
	};
	char hosts[256];

	(void)state;
	unsetenv("PGHOST");
	unsetenv("PGHOSTADDR");
	unsetenv("PGSSLMODE");
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		bool got = store_conninfo_plaintext(cases[i].conninfo, hosts,
						    sizeof(hosts));
		if (got != cases[i].plaintext ||
		    strcmp(hosts, cases[i].hosts) != 0)
			fail_msg("'%s': got %d '%s', want %d '%s'",
				 cases[i].conninfo, got, hosts,
				 cases[i].plaintext, cases[i].hosts);
		assert_null(strstr(hosts, "secret"));
	}
	/* NULL: libpq's environment, as libpq itself reads it. */
	assert_false(store_conninfo_plaintext(NULL, hosts, sizeof(hosts)));
	setenv("PGHOST", "db.env", 1);
	assert_true(store_conninfo_plaintext(NULL, hosts, sizeof(hosts)));
	assert_string_equal(hosts, "db.env");
	assert_true(store_conninfo_plaintext("dbname=x", hosts, sizeof(hosts)));
	setenv("PGSSLMODE", "verify-full", 1);
	assert_false(store_conninfo_plaintext(NULL, hosts, sizeof(hosts)));
	/* The string's own sslmode wins over the environment's. */
	assert_true(
	    store_conninfo_plaintext("sslmode=disable", hosts, sizeof(hosts)));
	unsetenv("PGHOST");
	unsetenv("PGSSLMODE");
	/* A small buffer is cut, never overrun. */
	assert_true(
	    store_conninfo_plaintext("host=aaaaaaaaaa,bbbbbbbb", hosts, 8));
	assert_true(strlen(hosts) < 8);
}

static void amqp_warn(void *as)
{
	rmq_settings_warn(as);
}

static size_t lines(const char *s)
{
	size_t n = 0;

	for (; *s; s++)
		n += *s == '\n';
	return n;
}

static struct rmq_settings amqp(const char *url)
{
	return (struct rmq_settings){.url = (char *)url, .tls_verify = true};
}

static void test_amqp_warnings(void **state)
{
	struct rmq_settings as;
	char *out;

	(void)state;
	log_setup(LOG_INFO, true);
	as = amqp("amqp://u:secret@rabbit.example:5672/v");
	out = capture_stderr(amqp_warn, &as);
	assert_int_equal(lines(out), 1);
	assert_non_null(strstr(out, "plaintext"));
	assert_non_null(strstr(out, "\"broker\":\"rabbit.example:5672\""));
	assert_null(strstr(out, "secret"));
	free(out);

	as = amqp("amqp://u:secret@127.0.0.1:5672");
	out = capture_stderr(amqp_warn, &as);
	assert_string_equal(out, "");
	free(out);

	as = amqp("amqps://u:secret@rabbit.example");
	out = capture_stderr(amqp_warn, &as);
	assert_string_equal(out, "");
	free(out);

	/* Verification off is warned about whatever the host. */
	as = amqp("amqps://u:secret@127.0.0.1");
	as.tls_verify = false;
	out = capture_stderr(amqp_warn, &as);
	assert_int_equal(lines(out), 1);
	assert_non_null(strstr(out, "OUTBOX_AMQP_TLS_VERIFY=off"));
	assert_null(strstr(out, "secret"));
	free(out);
}

static void kafka_warn(void *cfg)
{
	kafka_settings_warn(cfg);
}

static void test_kafka_warnings(void **state)
{
	struct kafka_prop props[2] = {
	    {(char *)"enable.ssl.certificate.verification", (char *)"false",
	     false},
	    {(char *)"security.protocol", (char *)"SASL_SSL", false},
	};
	struct kafka_settings ks = {
	    .brokers = (char *)"PLAINTEXT://k1.example:9092, 127.0.0.1:9093,"
			       "[2001:db8::1]:9092,[::1]:9094",
	    .topic = (char *)"t",
	};
	struct config cfg = {.parts = {{&kafka_settings_group, &ks}},
			     .n_parts = 1};
	char *out;

	(void)state;
	log_setup(LOG_INFO, true);
	out = capture_stderr(kafka_warn, &cfg);
	assert_int_equal(lines(out), 1);
	assert_non_null(strstr(out, "\"brokers\":\"k1.example,2001:db8::1\""));
	free(out);

	ks.brokers = (char *)"127.0.0.1:9092,localhost:9093";
	out = capture_stderr(kafka_warn, &cfg);
	assert_string_equal(out, "");
	free(out);

	/* TLS to remote brokers: nothing to say... */
	ks.brokers = (char *)"k1.example:9093";
	ks.props = &props[1];
	ks.n_props = 1;
	out = capture_stderr(kafka_warn, &cfg);
	assert_string_equal(out, "");
	free(out);
	/* ...unless verification is off. */
	ks.props = props;
	ks.n_props = 2;
	out = capture_stderr(kafka_warn, &cfg);
	assert_int_equal(lines(out), 1);
	assert_non_null(strstr(out, "verification is off"));
	free(out);
}

struct tls_case {
	const char *url;
	const char *ca, *cert, *key;
	bool verify;
	enum rmq_sasl sasl;
	const char *error; /* NULL: accepted */
};

static void test_amqp_tls_checks(void **state)
{
	static const struct tls_case cases[] = {
	    {"amqps://u:p@h", NULL, NULL, NULL, true, RMQ_SASL_PLAIN, NULL},
	    {"amqps://u:p@h", "/ca", NULL, NULL, false, RMQ_SASL_PLAIN, NULL},
	    {"amqps://h", "/ca", "/c", "/k", true, RMQ_SASL_EXTERNAL, NULL},
	    {"amqp://u:p@h", NULL, NULL, NULL, true, RMQ_SASL_PLAIN, NULL},
	    {"amqp://u:p@h", "/ca", NULL, NULL, true, RMQ_SASL_PLAIN,
	     "apply to TLS only"},
	    {"amqp://u:p@h", NULL, NULL, NULL, false, RMQ_SASL_PLAIN,
	     "apply to TLS only"},
	    {"amqp://u:p@h", NULL, "/c", "/k", true, RMQ_SASL_PLAIN,
	     "apply to TLS only"},
	    {"amqps://u:p@h", NULL, "/c", NULL, true, RMQ_SASL_PLAIN,
	     "set both or neither"},
	    {"amqps://u:p@h", NULL, NULL, "/k", true, RMQ_SASL_PLAIN,
	     "set both or neither"},
	    {"amqps://u:p@h", NULL, NULL, NULL, true, RMQ_SASL_EXTERNAL,
	     "OUTBOX_AMQP_SASL_MECHANISM=external"},
	    {"amqp://u:p@h", NULL, NULL, NULL, true, RMQ_SASL_EXTERNAL,
	     "OUTBOX_AMQP_SASL_MECHANISM=external"},
	};
	char err[512];

	(void)state;
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		const struct tls_case *c = &cases[i];
		struct rmq_settings as = {
		    .url = (char *)c->url,
		    .tls_ca_file = (char *)c->ca,
		    .tls_cert_file = (char *)c->cert,
		    .tls_key_file = (char *)c->key,
		    .tls_verify = c->verify,
		    .sasl = c->sasl,
		};
		int rc = rmq_settings_check(&as, err, sizeof(err));

		if (c->error ? rc == 0 || !strstr(err, c->error) : rc != 0)
			fail_msg("case %zu (%s): rc %d '%s', want %s", i,
				 c->url, rc, rc ? err : "",
				 c->error ? c->error : "accepted");
	}
	/* AMQP heartbeats are whole seconds. */
	struct rmq_settings hb = {.url = (char *)"amqp://u:p@h",
				  .tls_verify = true,
				  .heartbeat_ms = 1500};
	assert_int_equal(rmq_settings_check(&hb, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "OUTBOX_AMQP_HEARTBEAT: AMQP heartbeats "
				    "are whole seconds"));
	hb.heartbeat_ms = 2000;
	assert_int_equal(rmq_settings_check(&hb, err, sizeof(err)), 0);
}

/* The settings rows: defaults, and files that must be readable. */
static void test_amqp_tls_settings(void **state)
{
	struct config_extensions ext;
	struct config cfg;
	char *errs = NULL;
	size_t len = 0;
	FILE *f;

	(void)state;
	publisher_config_extensions(&ext);
	assert_int_equal(config_load(&cfg, &ext, NULL), 0);
	assert_null(rmq_settings_of(&cfg)->tls_ca_file);
	assert_null(rmq_settings_of(&cfg)->tls_cert_file);
	assert_null(rmq_settings_of(&cfg)->tls_key_file);
	assert_true(rmq_settings_of(&cfg)->tls_verify);
	assert_int_equal(rmq_settings_of(&cfg)->sasl, RMQ_SASL_PLAIN);
	config_release(&cfg);

	setenv("OUTBOX_AMQP_TLS_CA", "/nonexistent/ca.pem", 1);
	setenv("OUTBOX_AMQP_TLS_CERT", "/etc/hostname", 1);
	setenv("OUTBOX_AMQP_TLS_VERIFY", "off", 1);
	setenv("OUTBOX_AMQP_SASL_MECHANISM", "cram-md5", 1);
	f = open_memstream(&errs, &len);
	assert_non_null(f);
	assert_int_equal(config_load(&cfg, &ext, f), 2);
	fclose(f);
	assert_non_null(strstr(errs, "config: OUTBOX_AMQP_TLS_CA: cannot "
				     "read the file: No such file"));
	assert_non_null(strstr(errs, "config: OUTBOX_AMQP_SASL_MECHANISM: "
				     "unknown value; use one of: plain, "
				     "external"));
	assert_string_equal(rmq_settings_of(&cfg)->tls_cert_file,
			    "/etc/hostname");
	assert_false(rmq_settings_of(&cfg)->tls_verify);
	config_release(&cfg);
	free(errs);
	unsetenv("OUTBOX_AMQP_TLS_CA");
	unsetenv("OUTBOX_AMQP_TLS_CERT");
	unsetenv("OUTBOX_AMQP_TLS_VERIFY");
	unsetenv("OUTBOX_AMQP_SASL_MECHANISM");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_host_is_local),
	    cmocka_unit_test(test_postgres_plaintext),
	    cmocka_unit_test(test_amqp_warnings),
	    cmocka_unit_test(test_kafka_warnings),
	    cmocka_unit_test(test_amqp_tls_checks),
	    cmocka_unit_test(test_amqp_tls_settings),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
