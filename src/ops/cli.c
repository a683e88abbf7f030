/* SPDX-License-Identifier: MIT */
/* Operator subcommands: migrate, status, redrive, pause, resume, unblock. */
#include "ops.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/base.h"
#include "cli_int.h"
#include "cli_source.h"
#include "progress.h"
#include "status_text.h"
#include "store/store.h"

#define STATUS_ROWS 50
#define WATCH_DEFAULT_MS 2000
#define WATCH_MIN_MS 200
#define WATCH_MAX_MS 3600000
#define REASON_MAX 1000
#define DESTINATION_MAX 250

static int cmd_status(const struct subcommand *c, int argc, char **argv,
		      const struct config *cfg);
static int cmd_pause(const struct subcommand *c, int argc, char **argv,
		     const struct config *cfg);
static int cmd_resume(const struct subcommand *c, int argc, char **argv,
		      const struct config *cfg);
static int cmd_unblock(const struct subcommand *c, int argc, char **argv,
		       const struct config *cfg);
static int cmd_migrate(const struct subcommand *c, int argc, char **argv,
		       const struct config *cfg);

static const struct subcommand commands[] = {
    {"migrate", "[--quiet] [--contract] [--partition]",
     "Creates or upgrades the outbox table, its indexes, helper functions\n"
     "and side tables (idempotent; safe from several pods at once), and\n"
     "creates or drops the NOTIFY trigger to match OUTBOX_LISTEN. On a\n"
     "terminal, index builds show their progress (phase, blocks or\n"
     "tuples, from pg_stat_progress_create_index) on stderr.\n\n"
     "  --quiet     no progress\n"
     "  --contract  then the contract steps: drops what only relays of\n"
     "              an older protocol need; refused while the registry\n"
     "              shows such a relay alive. Run it once every relay\n"
     "              is upgraded, and start no older relay after it.\n"
     "  --partition then makes the table partitioned by id, the table\n"
     "              itself its default partition (one short transaction,\n"
     "              nothing copied; a contract step of protocol 1,\n"
     "              gated as --contract's are); refused while a view,\n"
     "              foreign key, publication, rule, policy or trigger\n"
     "              of yours names the table. Then, and at every run,\n"
     "              makes the next 2 days' partitions and drops the\n"
     "              days past retention, as the relay's cleaner does\n"
     "              when its role owns the table.\n",
     cmd_migrate},
    {"status", "[--json | --watch [INTERVAL]]",
     "Shows replicas (silent for more than 15s: dead), backlog, leases\n"
     "and who holds them, failed rows by type, pauses, blocked keys,\n"
     "dead tuples and what holds back vacuum.\n\n"
     "  --json             one JSON object instead of text\n"
     "  --watch [INTERVAL] a live view redrawn every INTERVAL (default\n"
     "                     2s, 200ms..1h) until Ctrl-C: backlog,\n"
     "                     throughput, time to drain, oldest pending, in\n"
     "                     flight by replica, failures; one plain line\n"
     "                     per interval when stdout is not a terminal\n",
     cmd_status},
    {"redrive",
     "(--id UUID... | --type T | --since T [--until T]) "
     "[--status failed|sent] [--dry-run] [--force] [--quiet]",
     "Returns failed rows (or, with --status sent, already-sent rows: a\n"
     "replay) to pending with attempts reset. Rows are chosen by id, by\n"
     "type and by when they finished; every given selector must match.\n\n"
     "  --id UUID        this row (repeatable)\n"
     "  --type T         rows of CloudEvents type T\n"
     "  --since T        finished at or after T\n"
     "  --until T        finished before T\n"
     "  --status S       failed (default) or sent; sent needs --since\n"
     "  --dry-run        count the rows, change nothing\n"
     "  --force          with OUTBOX_ORDERING=partition: redrive even rows\n"
     "                   whose key already has a later row sent (a row\n"
     "                   being published now refuses even so: run again)\n"
     "  --quiet          no progress line\n\n"
     "T is a timestamp Postgres reads ('2024-05-01 10:00+00') or a\n"
     "duration meaning that long ago (90s, 15m, 2h, 3d).\n\n"
     "Rows move in batches of 1000, each committed on its own. On a\n"
     "terminal a progress line on stderr shows rows done of the total,\n"
     "the rate and the time left. Ctrl-C stops after the current batch:\n"
     "the rows redriven so far stay pending, the command says how many\n"
     "and exits 1; run it again for the rest.\n",
     cli_redrive},
    {"pause", "[--destination D] [--reason R]",
     "Stops leasing on every replica within one poll interval, for all\n"
     "rows or for one destination (exchange or topic). Rows in flight\n"
     "finish; nothing is lost. Undo with `outbox-relay resume`.\n\n"
     "  --destination D  only rows bound for D (default: all leasing)\n"
     "  --reason R       shown by `outbox-relay status`\n",
     cmd_pause},
    {"resume", "[--destination D]",
     "Lifts a pause made by `outbox-relay pause`.\n\n"
     "  --destination D  the destination paused (default: the pause of\n"
     "                   all leasing)\n",
     cmd_resume},
    {"unblock", "--key K (--skip | --redrive)",
     "Lifts the block of a partition key whose row failed under\n"
     "OUTBOX_ORDERING_ON_FAILURE=block (see `outbox-relay status`).\n\n"
     "  --key K     the blocked partition key\n"
     "  --skip      leave the failed row failed; deliver the rest of K\n"
     "  --redrive   retry the failed row first (attempts reset), then\n"
     "              the rest of K\n",
     cmd_unblock},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

const char *cli_usage_lines(void)
{
	return "       outbox-relay status [--json | --watch [INTERVAL]]\n"
	       "                                 replicas, backlog, leases, "
	       "failures, pauses\n"
	       "       outbox-relay redrive (--id UUID... | --type T | "
	       "--since T [--until T])\n"
	       "                            [--status failed|sent] "
	       "[--dry-run] [--quiet]\n"
	       "                                 failed (or sent) rows back "
	       "to pending\n"
	       "       outbox-relay pause [--destination D] [--reason R]\n"
	       "                                 stop leasing on every "
	       "replica\n"
	       "       outbox-relay resume [--destination D]\n"
	       "                                 lift a pause\n"
	       "       outbox-relay unblock --key K (--skip | --redrive)\n"
	       "                                 release a key blocked by a "
	       "failed row\n";
}

static const struct subcommand *find(const char *cmd)
{
	for (size_t i = 0; i < N_COMMANDS; i++)
		if (strcmp(commands[i].name, cmd) == 0)
			return &commands[i];
	return NULL;
}

bool cli_knows(const char *cmd)
{
	return find(cmd) != NULL;
}

bool cli_help_asked(int argc, char **argv)
{
	/* The first word alone: a later one may be an option's value
	 * (pause --reason --help), which the command's own parse reads as
	 * such once the settings are loaded. */
	const struct subcommand *c = argc > 1 ? find(argv[0]) : NULL;
	if (!c ||
	    (strcmp(argv[1], "--help") != 0 && strcmp(argv[1], "-h") != 0))
		return false;
	cli_print_help(c);
	return true;
}

int cli_run(const char *cmd, int argc, char **argv, const struct config *cfg)
{
	const struct subcommand *c = find(cmd);
	if (!c) {
		fprintf(stderr, "outbox-relay: unknown command '%s'\n", cmd);
		return 2;
	}
	argc = cli_take_source(c->name, argc, argv);
	if (argc < 0)
		return 2;
	return c->run(c, argc, argv, cfg);
}

/* ---- shared helpers ---- */

/* Prints the problem and the usage line to stderr; returns 2. */
int cli_usage_error(const struct subcommand *c, const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "outbox-relay %s: ", c->name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nusage: outbox-relay %s %s\n", c->name, c->usage);
	return 2;
}

int cli_print_help(const struct subcommand *c)
{
	printf("usage: outbox-relay %s %s\n\n%s", c->name, c->usage, c->help);
	printf("\nSettings come from the environment as for the daemon "
	       "(OUTBOX_DATABASE_URL,\nOUTBOX_TABLE, ...). When OUTBOX_TABLE "
	       "lists several tables, --source TABLE\nsays which one, and "
	       "with OUTBOX_DATABASES --source DATABASE/TABLE (migrate:\nall "
	       "of them without it; status: a line for each). Exit codes: 0 "
	       "ok,\n1 runtime failure, 2 usage error.\n");
	return 0;
}

/* The long option named by the n bytes at name, written whole. */
static const struct option *long_option(const struct option *opts,
					const char *name, size_t n)
{
	for (const struct option *o = opts; o->name; o++)
		if (strlen(o->name) == n && strncmp(o->name, name, n) == 0)
			return o;
	return NULL;
}

/* Counts one more of option val; 2 with the problem printed when it came
 * twice and may not. */
static int count_option(const struct subcommand *c, const struct option *opts,
			int *seen, int val, const char *repeatable)
{
	if (++seen[(unsigned char)val] < 2 || strchr(repeatable, val))
		return -1;
	for (const struct option *o = opts; o->name; o++)
		if (o->val == val)
			return cli_usage_error(c, "option '--%s' given twice",
					       o->name);
	return cli_usage_error(c, "option '-%c' given twice", val);
}

int cli_check_options(const struct subcommand *c, int argc, char **argv,
		      const char *shortopts, const struct option *opts,
		      const char *repeatable)
{
	int seen[256] = {0};
	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		const char *w = argv[i];
		int bad = -1;
		if (strncmp(w, "--", 2) == 0) {
			size_t n = strcspn(w + 2, "=");
			const struct option *o = long_option(opts, w + 2, n);
			if (!o) {
				for (const struct option *p = opts;
				     n > 0 && p->name; p++)
					if (strncmp(p->name, w + 2, n) == 0)
						return cli_usage_error(
						    c,
						    "unknown option '%.*s' "
						    "(options are written "
						    "whole: '--%s'?)",
						    (int)(n + 2), w, p->name);
				continue; /* getopt_long says it is unknown */
			}
			/* Its value is the next word. */
			if (o->has_arg == required_argument && !w[2 + n])
				i++;
			bad = count_option(c, opts, seen, o->val, repeatable);
		} else if (w[0] == '-' && w[1]) {
			for (const char *q = w + 1; *q && bad < 0; q++) {
				const char *d = strchr(shortopts, *q);
				if (*q == ':' || !d)
					break;
				bad =
				    count_option(c, opts, seen, *q, repeatable);
				if (d[1] == ':') {
					i += !q[1];
					break;
				}
			}
		}
		if (bad >= 0)
			return bad;
	}
	optind = 0;
	opterr = 0;
	return -1;
}

/* Reports what getopt_long rejected; returns the exit code 2. */
int cli_bad_option(const struct subcommand *c, int opt, char **argv)
{
	const char *arg = argv[optind - 1];
	if (opt == ':')
		return cli_usage_error(c, "option '%s' needs a value", arg);
	/* A long option: getopt_long's optopt is its short twin, which is
	 * not what was written. */
	if (strncmp(arg, "--", 2) == 0) {
		const char *eq = strchr(arg, '=');
		if (eq && optopt && optopt != '?')
			return cli_usage_error(c,
					       "option '%.*s' takes no value",
					       (int)(eq - arg), arg);
		return cli_usage_error(c, "unknown option '%s'", arg);
	}
	if (optopt && optopt != '?') {
		char shown[3] = {'-', (char)optopt, '\0'};
		return cli_usage_error(c, "unknown option '%s'", shown);
	}
	return cli_usage_error(c, "unknown option '%s'", arg);
}

/* Connects for one command; prints the error and returns 1 on failure. */
int cli_open_store(const struct config *cfg, const char *cmd, struct store **s)
{
	char err[1024], app[64];
	*s = NULL;
	const char *conninfo;
	const char *table = cli_source_table(cfg, cmd, &conninfo);
	if (!table)
		return 2;
	snprintf(app, sizeof(app), "outbox-relay/%s", cmd);
	struct store_options o = store_options_from_config(cfg, app, NULL);
	o.table = table;
	o.conninfo = conninfo;
	o.prepare = false;
	if (store_open(s, &o, err, sizeof(err)) != 0) {
		fprintf(stderr, "outbox-relay %s: %s\n", cmd, err);
		return 1;
	}
	return 0;
}

/* What `status` was asked. */
struct status_args {
	bool json, watch;
	int64_t interval_ms;
};

/* Reads status's options. -1 when they were read, or the exit code. */
static int status_options(const struct subcommand *c, int argc, char **argv,
			  struct status_args *a)
{
	static const struct option opts[] = {
	    {"json", no_argument, NULL, 'j'},
	    {"watch", optional_argument, NULL, 'w'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0}};
	const char *interval = NULL;
	int opt = cli_check_options(c, argc, argv, ":jh", opts, "");
	if (opt >= 0)
		return opt;
	while ((opt = getopt_long(argc, argv, ":jh", opts, NULL)) != -1) {
		switch (opt) {
		case 'j':
			a->json = true;
			break;
		case 'w':
			a->watch = true;
			interval = optarg;
			break;
		case 'h':
			return cli_print_help(c);
		default:
			return cli_bad_option(c, opt, argv);
		}
	}
	/* "--watch 5s": the interval is the next word. */
	if (a->watch && !interval && optind < argc)
		interval = argv[optind++];
	if (optind < argc)
		return cli_usage_error(c, "unexpected argument '%s'",
				       argv[optind]);
	if (a->json && a->watch)
		return cli_usage_error(c,
				       "--json is a one-shot document; --watch "
				       "is a live view: choose one");
	a->interval_ms = WATCH_DEFAULT_MS;
	if (interval &&
	    (!cli_parse_interval(interval, &a->interval_ms) ||
	     a->interval_ms < WATCH_MIN_MS || a->interval_ms > WATCH_MAX_MS))
		return cli_usage_error(
		    c,
		    "--watch '%s': the interval is a duration "
		    "from 200ms to 1h (500ms, 2s, 1m)",
		    interval);
	return -1;
}

/* One snapshot, as text or JSON. */
static int status_once(struct store *s, bool json)
{
	cJSON *st = NULL;
	char err[1024];
	int ret = 1;
	if (store_admin_status(s, STATUS_ROWS, &st, err, sizeof(err)) != 0) {
		fprintf(stderr, "outbox-relay status: %s\n", err);
		goto out;
	}
	cJSON *list = status_attention(st);
	if (!list || !cJSON_AddItemToObject(st, "attention", list)) {
		cJSON_Delete(list);
		fprintf(stderr, "outbox-relay status: out of memory\n");
		goto out;
	}
	if (json) {
		char *text = cJSON_Print(st);
		if (!text) {
			fprintf(stderr, "outbox-relay status: out of memory\n");
			goto out;
		}
		printf("%s\n", text);
		cJSON_free(text);
	} else {
		status_print(st, stdout);
	}
	ret = fflush(stdout) == 0 ? 0 : 1;
out:
	cJSON_Delete(st);
	return ret;
}

static int cmd_status(const struct subcommand *c, int argc, char **argv,
		      const struct config *cfg)
{
	struct status_args a = {0};
	int ret = status_options(c, argc, argv, &a);
	if (ret >= 0)
		return ret;
	/* Of several sources, without --source: one line each. */
	bool several = cfg->n_tables > 1 || config_has_patterns(cfg) ||
		       config_n_databases(cfg) > 1;
	if (several && !cli_source_given() && !a.watch)
		return cli_status_sources(cfg, a.json);
	struct store *s = NULL;
	ret = cli_open_store(cfg, c->name, &s);
	if (ret != 0)
		return ret;
	if (a.watch) {
		cli_catch_interrupts();
		const char *conninfo;
		ret = status_watch(s, cli_source_table(cfg, c->name, &conninfo),
				   a.interval_ms, stdout, isatty(STDOUT_FILENO),
				   &cli_interrupted);
	} else {
		ret = status_once(s, a.json);
	}
	store_close(s);
	return ret;
}

/* ---- migrate ---- */

static int cmd_migrate(const struct subcommand *c, int argc, char **argv,
		       const struct config *cfg)
{
	static const struct option opts[] = {
	    {"quiet", no_argument, NULL, 'q'},
	    {"contract", no_argument, NULL, 'c'},
	    {"partition", no_argument, NULL, 'p'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0}};
	struct cli_migrate m = {0};
	int opt = cli_check_options(c, argc, argv, ":qcph", opts, "");
	if (opt >= 0)
		return opt;
	while ((opt = getopt_long(argc, argv, ":qcph", opts, NULL)) != -1) {
		if (opt == 'q')
			m.quiet = true;
		else if (opt == 'c')
			m.contract = true;
		else if (opt == 'p')
			m.partition = true;
		else if (opt == 'h')
			return cli_print_help(c);
		else
			return cli_bad_option(c, opt, argv);
	}
	if (optind < argc)
		return cli_usage_error(c, "unexpected argument '%s'",
				       argv[optind]);

	/* Every source, or --source's alone. */
	return cli_migrate_sources(c->name, cfg, &m);
}

/* ---- pause and resume ---- */

static void whoami(char *out, size_t outlen)
{
	char host[64] = "?";
	const char *user = getenv("USER");
	if (!user || !*user)
		user = getenv("LOGNAME");
	if (gethostname(host, sizeof(host)) != 0)
		snprintf(host, sizeof(host), "?");
	host[sizeof(host) - 1] = '\0';
	snprintf(out, outlen, "%s@%s", user && *user ? user : "unknown", host);
}

/* Reads pause's or resume's options. -1 when they were read, or the exit
 * code (--help, a usage error). */
static int pause_options(const struct subcommand *c, int argc, char **argv,
			 bool pause, const char **destination,
			 const char **reason)
{
	static const struct option opts[] = {
	    {"destination", required_argument, NULL, 'd'},
	    {"reason", required_argument, NULL, 'r'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0}};
	int opt = cli_check_options(c, argc, argv, pause ? ":d:r:h" : ":d:h",
				    opts, "");
	if (opt >= 0)
		return opt;
	while ((opt = getopt_long(argc, argv, pause ? ":d:r:h" : ":d:h", opts,
				  NULL)) != -1) {
		switch (opt) {
		case 'd':
			*destination = optarg;
			break;
		case 'r':
			if (!pause)
				return cli_usage_error(c, "unknown option '%s'",
						       "--reason");
			*reason = optarg;
			break;
		case 'h':
			return cli_print_help(c);
		default:
			return cli_bad_option(c, opt, argv);
		}
	}
	if (optind < argc)
		return cli_usage_error(c, "unexpected argument '%s'",
				       argv[optind]);
	if (strlen(*destination) > DESTINATION_MAX)
		return cli_usage_error(c,
				       "--destination is longer than %d bytes",
				       DESTINATION_MAX);
	if (*reason && strlen(*reason) > REASON_MAX)
		return cli_usage_error(c, "--reason is longer than %d bytes",
				       REASON_MAX);
	return -1;
}

static void pause_report(bool pause, bool existed, const char *destination)
{
	bool all = strcmp(destination, "*") == 0;
	char what[300] = "all leasing";
	if (!all)
		snprintf(what, sizeof(what), "destination '%s'", destination);
	if (pause && existed)
		printf("%s was already paused; reason and author updated\n",
		       what);
	else if (pause)
		printf("paused %s: every replica stops leasing %swithin one "
		       "poll interval; rows in flight finish.\nundo with: "
		       "outbox-relay resume%s%s%s\n",
		       what, all ? "" : "its rows ",
		       all ? "" : " --destination '", all ? "" : destination,
		       all ? "" : "'");
	else if (existed)
		printf("resumed %s: replicas lease again within one poll "
		       "interval\n",
		       what);
	else
		printf("nothing to resume: %s was not paused\n", what);
}

static int pause_or_resume(const struct subcommand *c, int argc, char **argv,
			   const struct config *cfg, bool pause)
{
	const char *destination = "*", *reason = NULL;
	int ret = pause_options(c, argc, argv, pause, &destination, &reason);
	if (ret >= 0)
		return ret;

	struct store *s = NULL;
	char err[1024], who[160];
	bool existed = false;
	ret = cli_open_store(cfg, c->name, &s);
	if (ret != 0)
		return ret;
	whoami(who, sizeof(who));
	int rc = pause ? store_admin_pause(s, destination, reason, who,
					   &existed, err, sizeof(err))
		       : store_admin_resume(s, destination, &existed, err,
					    sizeof(err));
	store_close(s);
	if (rc != 0) {
		fprintf(stderr, "outbox-relay %s: %s\n", c->name, err);
		return 1;
	}
	pause_report(pause, existed, destination);
	return 0;
}

static int cmd_pause(const struct subcommand *c, int argc, char **argv,
		     const struct config *cfg)
{
	return pause_or_resume(c, argc, argv, cfg, true);
}

static int cmd_resume(const struct subcommand *c, int argc, char **argv,
		      const struct config *cfg)
{
	return pause_or_resume(c, argc, argv, cfg, false);
}

/* ---- unblock ---- */

static int cmd_unblock(const struct subcommand *c, int argc, char **argv,
		       const struct config *cfg)
{
	static const struct option opts[] = {
	    {"key", required_argument, NULL, 'k'},
	    {"skip", no_argument, NULL, 's'},
	    {"redrive", no_argument, NULL, 'r'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	const char *key = NULL;
	int skip = 0, redrive = 0;
	int opt = cli_check_options(c, argc, argv, ":k:srh", opts, "");
	if (opt >= 0)
		return opt;
	while ((opt = getopt_long(argc, argv, ":k:srh", opts, NULL)) != -1) {
		switch (opt) {
		case 'k':
			key = optarg;
			break;
		case 's':
			skip = 1;
			break;
		case 'r':
			redrive = 1;
			break;
		case 'h':
			return cli_print_help(c);
		default:
			return cli_bad_option(c, opt, argv);
		}
	}
	if (optind < argc)
		return cli_usage_error(c, "unexpected argument '%s'",
				       argv[optind]);
	if (!key || !*key)
		return cli_usage_error(c, "--key is required");
	if (skip + redrive != 1)
		return cli_usage_error(
		    c, "give exactly one of --skip and --redrive");

	struct store *s;
	int rc = cli_open_store(cfg, c->name, &s);
	if (rc != 0)
		return rc;
	char err[1024];
	rc = store_unblock(s, key, redrive, err, sizeof(err));
	store_close(s);
	if (rc != 0) {
		fprintf(stderr, "outbox-relay unblock: %s\n", err);
		return 1;
	}
	printf("partition key '%s' unblocked: %s%s\n", key,
	       redrive ? "its failed row is pending again and goes first"
		       : "the rest of the key flows",
	       err);
	return 0;
}
