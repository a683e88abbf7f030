/* SPDX-License-Identifier: MIT */
/*
 * outbox-relay: the command line. `run` (the default) is the daemon;
 * the other subcommands are short operator tools.
 *
 * Exit codes: 0 ok; 1 runtime failure (unreachable service, a mark that
 * could not be written at shutdown); 2 usage or configuration error.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "config/config.h"
#include "encode/encode.h"
#include "loops/loops.h"
#include "ops/ops.h"
#include "publishers/publisher.h"
#include "store/store.h"

/* The settings of every backend and the checks whose rules live above
 * config. */
static struct config_extensions settings_extensions(void)
{
	struct config_extensions ext;

	publisher_config_extensions(&ext);
	ext.check_conninfo = store_conninfo_check;
	ext.check_ce_source = cloudevent_source_check;
	return ext;
}

static void usage(FILE *out)
{
	struct config_extensions ext = settings_extensions();

	fprintf(out,
		"usage: outbox-relay [run]        relay events (the daemon)\n"
		"       outbox-relay migrate [--quiet]\n"
		"                                 create or upgrade the "
		"outbox table\n"
		"       outbox-relay check        check settings and every "
		"connection\n"
		"%s"
		"       outbox-relay --help | --version\n"
		"\n"
		"Every setting comes from the environment (NAME, or a file "
		"named by NAME_FILE):\n\n",
		cli_usage_lines());
	config_print_help(out, &ext);
	fprintf(out, "\nExit codes: 0 ok, 1 runtime failure, 2 usage or "
		     "configuration error.\n");
}

/* `check` of a pattern: how many tables it matches now; 1 when the
 * catalog could not be read. */
static int check_pattern(const struct store_options *o, const char *url)
{
	char err[1024];
	char **names = NULL;
	size_t n = 0;
	if (store_catalog_match(o, o->table, &names, &n, err, sizeof(err)) !=
	    0) {
		printf("postgres (%s): FAILED: pattern %s: %s\n", url, o->table,
		       err);
		return 1;
	}
	printf("postgres (%s): ok, pattern %s matches %zu tables%s%s\n", url,
	       o->table, n, n ? ", the first " : "", n ? names[0] : "");
	store_names_free(names, n);
	return 0;
}

/* The database's URL for a line of output, its password hidden; with
 * several databases, its name first. */
static void database_label(const struct config *cfg, size_t d, char *out,
			   size_t outlen)
{
	char url[512];
	const char *conninfo = config_database_url(cfg, d);
	config_redact_url(conninfo ? conninfo : "(libpq PG* variables)", url,
			  sizeof(url));
	if (config_n_databases(cfg) > 1)
		snprintf(out, outlen, "%s: %s", config_database_name(cfg, d),
			 url);
	else
		snprintf(out, outlen, "%s", url);
}

/* `check` of every table of OUTBOX_TABLE in database d; the failures. */
static int check_database(const struct config *cfg, size_t d)
{
	int failures = 0;
	char err[1024], url[600];
	database_label(cfg, d, url, sizeof(url));
	struct store_options o =
	    store_options_from_config(cfg, "outbox-relay/check", NULL);
	o.prepare = false;
	o.conninfo = config_database_url(cfg, d);
	struct store *first = NULL;
	for (size_t i = 0; i < cfg->n_tables; i++) {
		struct store *s = NULL;
		o.table = cfg->tables[i];
		if (table_is_pattern(o.table)) {
			failures += check_pattern(&o, url);
			continue;
		}
		if (store_open_sharing(&s, &o, first, err, sizeof(err)) != 0) {
			printf("postgres (%s): FAILED: %s\n", url, err);
			failures++;
			continue;
		}
		printf("postgres (%s): ok, table %s present\n", url,
		       cfg->tables[i]);
		if (first)
			store_close(s);
		else
			first = s;
	}
	store_close(first);
	return failures;
}

static int cmd_check(const struct config *cfg,
		     const struct publisher_ops *pub_ops)
{
	int failures = 0;
	char err[1024];
	printf("config: ok\n");
	for (size_t d = 0; d < config_n_databases(cfg); d++)
		failures += check_database(cfg, d);
	struct publisher pub;
	publisher_init(&pub, pub_ops);
	if (publisher_open(&pub, cfg, err, sizeof(err)) != 0 ||
	    publisher_probe(&pub, err, sizeof(err)) != 0) {
		printf("publisher %s: FAILED: %s\n", pub_ops->name, err);
		failures++;
	} else {
		printf("publisher %s: ok\n", pub_ops->name);
	}
	publisher_close(&pub);
	return failures ? 1 : 0;
}

/* Of database d: fails fast on what retrying cannot fix (a missing table); an
 * unreachable database is left to the workers, which keep retrying. */
static int check_tables_at_start(const struct config *cfg, size_t d)
{
	char err[1024];
	struct store_options o =
	    store_options_from_config(cfg, "outbox-relay/start", NULL);
	o.prepare = false;
	o.conninfo = config_database_url(cfg, d);
	struct store *first = NULL;
	int failed = 0;
	/* Every listed table: a typo in a list is caught now, not as one
	 * source failing for ever. A pattern may match nothing yet. */
	for (size_t i = 0; i < cfg->n_tables; i++) {
		struct store *s = NULL;
		o.table = cfg->tables[i];
		if (table_is_pattern(o.table))
			continue;
		int rc = store_open_sharing(&s, &o, first, err, sizeof(err));
		if (rc == STORE_RECONNECT) {
			log_error("%s (retrying)", err);
			break;
		}
		if (rc != 0) {
			log_error("%s", err);
			failed = 1;
		} else if (first) {
			store_close(s);
		} else {
			first = s;
		}
	}
	store_close(first);
	return failed;
}

static int cmd_run(const struct config *cfg,
		   const struct publisher_ops *pub_ops)
{
	char err[1024];
	struct relay *relay = NULL;
	for (size_t d = 0; d < config_n_databases(cfg); d++)
		if (check_tables_at_start(cfg, d) != 0)
			return 1;
	if (relay_create(&relay, cfg, pub_ops, err, sizeof(err)) != 0) {
		log_error("%s", err);
		return 1;
	}

	/* Signals reach only this thread: the loops inherit a mask that
	 * blocks them, and this thread takes them with sigtimedwait, so no
	 * handler runs in async-signal context. SIGPIPE is ignored so a
	 * closed socket or stdout is an error return, not death. */
	signal(SIGPIPE, SIG_IGN);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);

	if (relay_start(relay, err, sizeof(err)) != 0) {
		log_error("%s", err);
		relay_join(relay);
		relay_destroy(relay);
		return 1;
	}
	if (ops_start(relay, err, sizeof(err)) != 0) {
		log_error("%s", err);
		relay_stop(relay);
		relay_join(relay);
		relay_destroy(relay);
		return 1;
	}
	char source[256];
	const char *url = config_database_url(cfg, 0);
	config_redact_url(url ? url : "(PG*)", source, sizeof(source));
	log_fields(LOG_INFO, "outbox-relay started", "version", OUTBOX_VERSION,
		   "publisher", pub_ops->name, "table", cfg->table, "database",
		   cfg->n_databases ? cfg->databases_list : source, NULL);

	int64_t deadline = 0;
	for (;;) {
		struct timespec ts = {.tv_sec = 0, .tv_nsec = 200000000};
		int sig = sigtimedwait(&set, NULL, &ts);
		if (sig > 0) {
			if (relay_stopping(relay)) {
				log_warn("second signal: exiting at once");
				_exit(1);
			}
			log_fields(LOG_INFO, "shutting down", "signal",
				   sig == SIGTERM ? "SIGTERM" : "SIGINT", NULL);
			ops_draining(relay);
			relay_stop(relay);
			deadline = clock_ms() + cfg->shutdown_timeout_ms;
		}
		if (deadline && relay_finished(relay))
			break;
		if (deadline && clock_ms() > deadline + 2000) {
			log_error("shutdown timeout passed with loops still "
				  "running; exiting");
			_exit(1);
		}
	}
	int rc = relay_join(relay);
	bool ops_stopped = ops_stop(relay);
	log_fields(LOG_INFO, "outbox-relay stopped", "exit", rc ? "1" : "0",
		   NULL);
	if (!ops_stopped) {
		/* The ops thread reads the relay and the config: freeing
		 * them, or exit()'s clean-up of libpq under its connect,
		 * could crash the way out. */
		fflush(NULL);
		_exit(rc);
	}
	relay_destroy(relay);
	return rc;
}

extern char **environ;

/* A misspelt setting would otherwise be ignored in silence. A warning, not
 * an error: platforms inject variables of their own (Kubernetes service
 * links named after a Service called outbox-...). */
static void warn_unknown_settings(const struct config_extensions *ext)
{
	for (char **e = environ; *e; e++) {
		if (strncmp(*e, "OUTBOX_", 7) != 0)
			continue;
		char name[128];
		size_t n = strcspn(*e, "=");
		snprintf(name, sizeof(name), "%.*s", (int)n, *e);
		if (!config_knows(ext, name))
			log_warn("unknown setting %s is ignored", name);
	}
}

/* One warning per link that crosses the network in plaintext (or, for a
 * backend, with TLS verification off): the operator may not know. The
 * lines name hosts, never users or secrets. */
static void warn_links(const struct config *cfg,
		       const struct publisher_ops *pub_ops)
{
	char hosts[512];

	for (size_t d = 0; d < config_n_databases(cfg); d++) {
		const char *url = config_database_url(cfg, d);
		const char *listen_url = config_listen_url(cfg, d);
		if (store_conninfo_plaintext(url, hosts, sizeof(hosts)))
			log_fields(LOG_WARN,
				   "postgres: the link may run in plaintext to "
				   "a host that is not loopback; set "
				   "sslmode=verify-full",
				   "link", "postgres", "hosts", hosts, NULL);
		if (cfg->listen && listen_url &&
		    store_conninfo_plaintext(listen_url, hosts, sizeof(hosts)))
			log_fields(LOG_WARN,
				   "postgres listener: the link may run in "
				   "plaintext to a host that is not loopback; "
				   "set sslmode=verify-full",
				   "link", "postgres listener", "hosts", hosts,
				   NULL);
	}
	publisher_warn_links(pub_ops, cfg);
}

int main(int argc, char **argv)
{
	struct config_extensions ext = settings_extensions();
	const char *cmd = argc > 1 ? argv[1] : "run";
	if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ||
	    strcmp(cmd, "help") == 0) {
		usage(stdout);
		return 0;
	}
	if (strcmp(cmd, "--version") == 0) {
		printf("outbox-relay %s\n", OUTBOX_VERSION);
		return 0;
	}
	if (strcmp(cmd, "--settings-markdown") == 0) {
		config_print_markdown(stdout, &ext);
		return 0;
	}
	bool known = strcmp(cmd, "run") == 0 || strcmp(cmd, "check") == 0 ||
		     cli_knows(cmd);
	if (!known) {
		fprintf(stderr, "outbox-relay: unknown command '%s'\n", cmd);
		usage(stderr);
		return 2;
	}
	if (argc > 2 && !cli_knows(cmd)) {
		if (strcmp(argv[2], "--help") == 0) {
			usage(stdout);
			return 0;
		}
		fprintf(stderr, "outbox-relay %s: unexpected argument '%s'\n",
			cmd, argv[2]);
		return 2;
	}
	if (cli_help_asked(argc - 1, argv + 1))
		return 0;

	struct config cfg;
	int problems = config_load(&cfg, &ext, stderr);
	if (problems > 0) {
		fprintf(stderr,
			"outbox-relay: %d configuration problem%s; see "
			"`outbox-relay --help`\n",
			problems, problems == 1 ? "" : "s");
		config_release(&cfg);
		return 2;
	}
	log_setup(cfg.log_level, cfg.log_format == LOG_FORMAT_JSON);
	warn_unknown_settings(&ext);
	for (const char *w = cfg.warnings; *w;) {
		size_t n = strcspn(w, "\n");
		log_warn("%.*s", (int)n, w);
		w += n + (w[n] == '\n');
	}

	int rc;
	const struct publisher_ops *pub_ops = publisher_find(cfg.publisher);
	char err[1024];
	if (!pub_ops) {
		fprintf(stderr,
			"outbox-relay: OUTBOX_PUBLISHER: unknown "
			"backend '%s'\n",
			cfg.publisher);
		rc = 2;
	} else if (publisher_validate(pub_ops, &cfg, err, sizeof(err)) != 0) {
		fprintf(stderr, "outbox-relay: %s\n", err);
		rc = 2;
	} else if (strcmp(cmd, "check") == 0) {
		warn_links(&cfg, pub_ops);
		rc = cmd_check(&cfg, pub_ops);
	} else if (strcmp(cmd, "run") == 0) {
		warn_links(&cfg, pub_ops);
		rc = cmd_run(&cfg, pub_ops);
	} else {
		rc = cli_run(cmd, argc - 1, argv + 1, &cfg);
	}
	config_release(&cfg);
	return rc;
}
