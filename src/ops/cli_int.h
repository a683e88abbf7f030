/* SPDX-License-Identifier: MIT */
/*
 * What the operator commands share (cli.c) and the commands kept in files
 * of their own. Private to src/ops/.
 */
#ifndef OUTBOX_OPS_CLI_INT_H
#define OUTBOX_OPS_CLI_INT_H

struct config;
struct store;

struct subcommand {
	const char *name;
	const char *usage; /* arguments, for "usage: outbox-relay NAME ..." */
	const char *help;  /* the rest of --help */
	int (*run)(const struct subcommand *c, int argc, char **argv,
		   const struct config *cfg);
};

/* Prints the problem and the usage line to stderr; returns 2. */
int cli_usage_error(const struct subcommand *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prints the command's --help; returns 0. */
int cli_print_help(const struct subcommand *c);

struct option;

/*
 * Refuses, before getopt_long reads argv, what it would take silently: a
 * long option written in part ("--con" for --contract, a one-way step)
 * and an option given twice that is not in repeatable (its vals: the
 * last one given would win). shortopts and opts as for getopt_long.
 * Returns -1 when argv has neither, getopt_long readied for argv (optind
 * and opterr 0), else 2, the problem printed.
 */
int cli_check_options(const struct subcommand *c, int argc, char **argv,
		      const char *shortopts, const struct option *opts,
		      const char *repeatable);

/* Reports what getopt_long rejected; returns the exit code 2. */
int cli_bad_option(const struct subcommand *c, int opt, char **argv);

/* Connects for one command; prints the error and returns 1 on failure
 * (2 when --source names no table). */
int cli_open_store(const struct config *cfg, const char *cmd, struct store **s);

/* `redrive` (cli_redrive.c). */
int cli_redrive(const struct subcommand *c, int argc, char **argv,
		const struct config *cfg);

#endif
