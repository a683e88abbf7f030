/* SPDX-License-Identifier: MIT */
/* The operator command `redrive` (docs/operations.md): failed rows, or sent
 * ones in a time range, pending again. */
#include "cli_int.h"

#include <ctype.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "config/config.h"
#include "progress.h"
#include "store/store.h"

static bool is_uuid(const char *s)
{
	static const char shape[] = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx";
	if (strlen(s) != sizeof(shape) - 1)
		return false;
	for (size_t i = 0; shape[i]; i++) {
		bool ok = shape[i] == '-' ? s[i] == '-'
					  : isxdigit((unsigned char)s[i]) != 0;
		if (!ok)
			return false;
	}
	return true;
}

/* What `redrive` was asked; ids point into argv. */
struct redrive_args {
	const char **ids;
	size_t n_ids;
	const char *type, *since, *until;
	const char *status; /* failed or sent */
	bool dry_run, force, quiet;
};

/* Reads redrive's options into a: -1 when read, else the exit code. */
static int redrive_options(const struct subcommand *c, int argc, char **argv,
			   struct redrive_args *a)
{
	static const struct option opts[] = {
	    {"id", required_argument, NULL, 'i'},
	    {"type", required_argument, NULL, 't'},
	    {"since", required_argument, NULL, 's'},
	    {"until", required_argument, NULL, 'u'},
	    {"status", required_argument, NULL, 'S'},
	    {"dry-run", no_argument, NULL, 'n'},
	    {"force", no_argument, NULL, 'f'},
	    {"quiet", no_argument, NULL, 'q'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0}};
	int opt =
	    cli_check_options(c, argc, argv, ":i:t:s:u:S:nfqh", opts, "i");
	if (opt >= 0)
		return opt;
	while ((opt = getopt_long(argc, argv, ":i:t:s:u:S:nfqh", opts, NULL)) !=
	       -1) {
		switch (opt) {
		case 'i':
			if (!is_uuid(optarg))
				return cli_usage_error(
				    c, "--id '%s' is not a UUID", optarg);
			a->ids[a->n_ids++] = optarg;
			break;
		case 't':
			a->type = optarg;
			break;
		case 's':
			a->since = optarg;
			break;
		case 'u':
			a->until = optarg;
			break;
		case 'S':
			a->status = optarg;
			break;
		case 'n':
			a->dry_run = true;
			break;
		case 'f':
			a->force = true;
			break;
		case 'q':
			a->quiet = true;
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
	return -1;
}

/* Checks that the options make one request; -1 when they do, else 2. */
static int redrive_check(const struct subcommand *c,
			 const struct redrive_args *a)
{
	bool sent = strcmp(a->status, "sent") == 0;
	if (strcmp(a->status, "failed") != 0 && !sent)
		return cli_usage_error(
		    c, "--status '%s': must be failed or sent", a->status);
	if (a->type && !*a->type)
		return cli_usage_error(c, "--type must not be empty");
	if (sent && !a->since)
		return cli_usage_error(c,
				       "--status sent replays delivered events "
				       "and needs a time range: --since T "
				       "[--until T]");
	if (a->n_ids == 0 && !a->type && !a->since)
		return cli_usage_error(c,
				       "choose the rows with --id, --type or "
				       "--since");
	if (a->until && !a->since)
		return cli_usage_error(c, "--until needs --since");
	return -1;
}

/* Resolves --since and --until on the database clock into since_at and
 * until_at (64 bytes each). -1 when done, else the exit code. */
static int redrive_times(const struct subcommand *c, struct store *s,
			 const struct redrive_args *a, char *since_at,
			 char *until_at)
{
	char err[1024], now[64];
	/* A range ends now at the latest: rows it redrives finish after
	 * it, and a failed row failing again while the command runs would
	 * otherwise be taken again (failed rows go in unsliced batches). */
	const char *times[3] = {a->since, a->until, "now"};
	char *resolved[3] = {since_at, until_at, now};
	for (int i = 0; i < 3; i++) {
		if (!times[i])
			continue;
		int rc = store_admin_time(s, times[i], resolved[i], 64, err,
					  sizeof(err));
		if (rc == STORE_INVALID)
			return cli_usage_error(c, "%s", err);
		if (rc != 0) {
			fprintf(stderr, "outbox-relay redrive: %s\n", err);
			return 1;
		}
	}
	/* One fixed format (UTC, to the microsecond): compared as text. */
	bool at_now = !a->until || strcmp(until_at, now) > 0;
	if (at_now)
		snprintf(until_at, 64, "%s", now);
	if (a->since && strcmp(since_at, until_at) >= 0)
		return cli_usage_error(c, "--since is not before %s (%s, %s)",
				       at_now ? "now" : "--until", since_at,
				       until_at);
	return -1;
}

static void redrive_report(const struct redrive_args *a, size_t count,
			   const char *since_at, const char *until_at)
{
	char range[200] = "";
	if (a->since)
		snprintf(range, sizeof(range), ", finished from %s%s%s",
			 since_at, until_at[0] ? " until " : "", until_at);
	if (a->dry_run)
		printf("dry run: %zu %s row%s match%s; nothing changed\n",
		       count, a->status, count == 1 ? "" : "s", range);
	else if (strcmp(a->status, "sent") == 0)
		printf("replayed %zu sent row%s%s: pending again with attempts "
		       "reset; consumers will receive them again\n",
		       count, count == 1 ? "" : "s", range);
	else
		printf("redrove %zu failed row%s%s: pending again with "
		       "attempts reset\n",
		       count, count == 1 ? "" : "s", range);
}

int cli_redrive(const struct subcommand *c, int argc, char **argv,
		const struct config *cfg)
{
	struct redrive_args a = {.status = "failed"};
	struct store *s = NULL;
	char err[1024], since_at[64] = "", until_at[64] = "";
	int ret;
	a.ids = calloc((size_t)argc + 1, sizeof(*a.ids));
	if (!a.ids) {
		fprintf(stderr, "outbox-relay redrive: out of memory\n");
		return 1;
	}
	ret = redrive_options(c, argc, argv, &a);
	if (ret < 0)
		ret = redrive_check(c, &a);
	if (ret >= 0)
		goto out;
	ret = cli_open_store(cfg, c->name, &s);
	if (ret != 0)
		goto out;
	ret = redrive_times(c, s, &a, since_at, until_at);
	if (ret >= 0)
		goto out;
	struct redrive_filter f = {
	    .ids = a.ids,
	    .n_ids = a.n_ids,
	    .type = a.type,
	    .since = a.since ? since_at : NULL,
	    .until = until_at[0] ? until_at : NULL,
	    .sent = strcmp(a.status, "sent") == 0,
	    .dry_run = a.dry_run,
	    .force = a.force,
	    .sent_kept_ms = cfg->retention_ms,
	};
	size_t count = 0;
	struct cli_progress p;
	cli_progress_init(&p, c->name, a.quiet, &cli_interrupted);
	if (!a.dry_run) {
		/* Interrupted, the batches done stay done (progress.h). */
		cli_catch_interrupts();
		f.progress = &p.watcher;
		f.count_first = p.on;
	}
	ret = 1;
	int rc = store_redrive(s, &f, &count, err, sizeof(err));
	cli_progress_end(&p);
	/* The range as resolved: run again, a relative --since (2h) would
	 * start later, past rows this run did not reach. */
	char rest[200] = "the same command";
	if (a.since)
		snprintf(rest, sizeof(rest),
			 "it with --since '%s' --until '%s'", since_at,
			 until_at);
	if (rc != 0)
		fprintf(stderr, "outbox-relay redrive: %s\n", err);
	/* A refusal before any batch has no rest to run again for. */
	if ((rc != 0 && !a.dry_run && count > 0) || cli_interrupted)
		printf("%s: %zu %s row%s redriven before the %s are pending "
		       "again with attempts reset; run %s again for the rest\n",
		       rc ? "stopped" : "interrupted", count, a.status,
		       count == 1 ? "" : "s", rc ? "error" : "stop", rest);
	if (rc != 0 || cli_interrupted)
		goto out;
	redrive_report(&a, count, since_at, until_at);
	ret = 0;
out:
	store_close(s);
	free(a.ids);
	return ret;
}
