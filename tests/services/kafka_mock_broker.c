/* SPDX-License-Identifier: MIT */
/*
 * Kafka test broker: serves librdkafka's in-process mock cluster on loopback
 * to other processes and injects faults on command. Test-only; the mock has
 * no TLS, SASL or CreateTopics and its API is not stable across versions.
 *
 * Usage: kafka_mock_broker [--brokers N] [--topic NAME:PARTITIONS]...
 *                          [--honor-auto-create-flag] [--control FIFO]
 *
 * The mock creates unknown topics on Metadata requests (4 partitions). It
 * has no switch to stop that: only a client's Metadata v4+ request can, via
 * allow.auto.create.topics=false, and the 2.0.2 mock advertises Metadata v2.
 * --honor-auto-create-flag advertises v4 so such clients see unknown topics
 * as unknown; `topic_error TOPIC UNKNOWN_TOPIC_OR_PART` works for any client.
 *
 * The first line on stdout is "BOOTSTRAP=host:port,...". With --control,
 * commands are read line by line from FIFO (created if missing) and each is
 * answered on stdout with "ok SEQ: LINE" or "error SEQ: LINE: REASON",
 * SEQ counting commands from 1. Runs until SIGTERM or SIGINT.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#define PROG "kafka_mock_broker"
#define MAX_BROKERS 32
#define MAX_TOPICS 64
#define MAX_PARTITIONS 1000
#define MAX_WORDS 64
#define LINE_MAX_LEN 1024

/* Kafka protocol ApiKey numbers accepted by push_errors/clear_errors; the
 * constants live in a librdkafka header that is not installed. */
#define MAX_API_KEY 100
#define API_KEY_METADATA 3

/* Kafka's own limit on topic name length. */
#define TOPIC_NAME_MAX 249

struct topic_spec {
	char name[TOPIC_NAME_MAX + 1];
	int partitions;
};

struct options {
	int brokers;
	struct topic_spec topics[MAX_TOPICS];
	size_t topic_cnt;
	bool metadata_v4;	  /* --honor-auto-create-flag */
	const char *control_path; /* borrowed from argv; NULL: no control */
};

/* Bytes read from the control FIFO that do not yet end in a newline. */
struct linebuf {
	char buf[LINE_MAX_LEN];
	size_t len;
	bool overflow; /* current line too long; dropped up to its newline */
};

/* Thread-safe strerror (GNU variant: may return a static string). */
static const char *errno_str(int errnum, char *buf, size_t len)
{
	return strerror_r(errnum, buf, len);
}

static void usage(FILE *out)
{
	fprintf(
	    out,
	    "usage: " PROG " [--brokers N] [--topic NAME:PARTITIONS]...\n"
	    "                         [--honor-auto-create-flag] "
	    "[--control FIFO]\n"
	    "control commands, one per line:\n"
	    "  broker_down ID | broker_up ID | all_down | all_up\n"
	    "  rtt ID MS\n"
	    "  push_errors APIKEY COUNT ERR...   (ERR: number or name,\n"
	    "                                     one ERR is repeated COUNT "
	    "times)\n"
	    "  clear_errors APIKEY\n"
	    "  topic_error TOPIC ERR             (ERR 0 clears)\n"
	    "  create_topic TOPIC PARTITIONS\n"
	    "  leader TOPIC PARTITION ID         (ID -1: no leader)\n");
}

/* Parses a whole string as a base-10 integer in [min, max]. */
static int parse_long(const char *s, long min, long max, long *out)
{
	char *end = NULL;
	long v;

	if (*s == '\0')
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

/*
 * Accepts a Kafka error code as a number ("6") or as librdkafka names it,
 * with or without the RD_KAFKA_RESP_ERR_ prefix ("NOT_LEADER_FOR_PARTITION").
 */
static int parse_errcode(const char *s, rd_kafka_resp_err_t *out, char *err,
			 size_t errlen)
{
	const struct rd_kafka_err_desc *descs = NULL;
	const char *name = s;
	size_t cnt = 0;
	long v;

	if (parse_long(s, INT16_MIN, INT16_MAX, &v) == 0) {
		*out = (rd_kafka_resp_err_t)v;
		return 0;
	}
	if (strncmp(name, "RD_KAFKA_RESP_ERR_", 18) == 0)
		name += 18;
	rd_kafka_get_err_descs(&descs, &cnt);
	for (size_t i = 0; i < cnt; i++) {
		if (descs[i].name && strcmp(descs[i].name, name) == 0) {
			*out = descs[i].code;
			return 0;
		}
	}
	snprintf(err, errlen, "unknown error code '%s'", s);
	return -1;
}

static int parse_topic_spec(const char *arg, struct topic_spec *spec, char *err,
			    size_t errlen)
{
	const char *colon = strrchr(arg, ':');
	size_t name_len = colon ? (size_t)(colon - arg) : 0;
	long partitions;

	if (name_len == 0) {
		snprintf(err, errlen, "--topic '%s': expected NAME:PARTITIONS",
			 arg);
		return -1;
	}
	/* Kafka's rule for topic names; the mock itself checks nothing. */
	if (name_len > TOPIC_NAME_MAX ||
	    strspn(arg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
			"0123456789._-") != name_len) {
		snprintf(err, errlen,
			 "--topic '%s': name must be 1..%d of [A-Za-z0-9._-]",
			 arg, TOPIC_NAME_MAX);
		return -1;
	}
	if (parse_long(colon + 1, 1, MAX_PARTITIONS, &partitions) != 0) {
		snprintf(err, errlen, "--topic '%s': partitions must be 1..%d",
			 arg, MAX_PARTITIONS);
		return -1;
	}
	memcpy(spec->name, arg, name_len);
	spec->name[name_len] = '\0';
	spec->partitions = (int)partitions;
	return 0;
}

static int options_parse(int argc, char **argv, struct options *opt, char *err,
			 size_t errlen)
{
	long v;

	opt->brokers = 3;
	opt->topic_cnt = 0;
	opt->metadata_v4 = false;
	opt->control_path = NULL;

	for (int i = 1; i < argc; i++) {
		const char *arg = argv[i];
		const char *val = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
			usage(stdout);
			exit(0);
		}
		if (strcmp(arg, "--honor-auto-create-flag") == 0) {
			opt->metadata_v4 = true;
			continue;
		}
		if (strcmp(arg, "--brokers") != 0 &&
		    strcmp(arg, "--topic") != 0 &&
		    strcmp(arg, "--control") != 0) {
			snprintf(err, errlen, "unknown argument '%s'", arg);
			return -1;
		}
		if (!val) {
			snprintf(err, errlen, "%s needs a value", arg);
			return -1;
		}
		i++;
		if (strcmp(arg, "--brokers") == 0) {
			if (parse_long(val, 1, MAX_BROKERS, &v) != 0) {
				snprintf(err, errlen,
					 "--brokers '%s': must be 1..%d", val,
					 MAX_BROKERS);
				return -1;
			}
			opt->brokers = (int)v;
		} else if (strcmp(arg, "--topic") == 0) {
			if (opt->topic_cnt == MAX_TOPICS) {
				snprintf(err, errlen,
					 "too many --topic options (max %d)",
					 MAX_TOPICS);
				return -1;
			}
			if (parse_topic_spec(val, &opt->topics[opt->topic_cnt],
					     err, errlen) != 0)
				return -1;
			opt->topic_cnt++;
		} else {
			opt->control_path = val;
		}
	}
	return 0;
}

/* Same replication factor as the mock gives auto-created topics. */
static int replication_factor(int brokers)
{
	return brokers < 3 ? brokers : 3;
}

static int topics_create(rd_kafka_mock_cluster_t *mc, const struct options *opt,
			 char *err, size_t errlen)
{
	for (size_t i = 0; i < opt->topic_cnt; i++) {
		const struct topic_spec *t = &opt->topics[i];
		rd_kafka_resp_err_t rerr = rd_kafka_mock_topic_create(
		    mc, t->name, t->partitions,
		    replication_factor(opt->brokers));

		if (rerr) {
			snprintf(err, errlen, "cannot create topic '%s': %s",
				 t->name, rd_kafka_err2str(rerr));
			return -1;
		}
	}
	return 0;
}

static rd_kafka_resp_err_t broker_set(rd_kafka_mock_cluster_t *mc, int32_t id,
				      bool up)
{
	return up ? rd_kafka_mock_broker_set_up(mc, id)
		  : rd_kafka_mock_broker_set_down(mc, id);
}

/* Splits line in place on blanks; returns the number of words. */
static size_t words_split(char *line, char **words, size_t max)
{
	size_t n = 0;
	char *save = NULL;

	for (char *w = strtok_r(line, " \t\r", &save); w && n < max;
	     w = strtok_r(NULL, " \t\r", &save))
		words[n++] = w;
	return n;
}

static int broker_id_parse(const char *s, int brokers, int32_t *id, char *err,
			   size_t errlen)
{
	long v;

	if (parse_long(s, 1, brokers, &v) != 0) {
		snprintf(err, errlen, "broker id '%s' is not in 1..%d", s,
			 brokers);
		return -1;
	}
	*id = (int32_t)v;
	return 0;
}

static int rerr_check(rd_kafka_resp_err_t rerr, const char *what, char *err,
		      size_t errlen)
{
	if (!rerr)
		return 0;
	snprintf(err, errlen, "%s: %s", what, rd_kafka_err2str(rerr));
	return -1;
}

static int cmd_push_errors(rd_kafka_mock_cluster_t *mc, char **w, size_t n,
			   char *err, size_t errlen)
{
	rd_kafka_resp_err_t codes[MAX_WORDS];
	long api_key, count;

	if (n < 4) {
		snprintf(err, errlen, "usage: push_errors APIKEY COUNT ERR...");
		return -1;
	}
	if (parse_long(w[1], 0, MAX_API_KEY, &api_key) != 0) {
		snprintf(err, errlen, "api key '%s' is not in 0..%d", w[1],
			 MAX_API_KEY);
		return -1;
	}
	if (parse_long(w[2], 1, MAX_WORDS, &count) != 0) {
		snprintf(err, errlen, "count '%s' is not in 1..%d", w[2],
			 MAX_WORDS);
		return -1;
	}
	/* One code means "this error COUNT times"; else one code per error. */
	if (n - 3 != 1 && n - 3 != (size_t)count) {
		snprintf(err, errlen,
			 "count %ld does not match %zu error codes", count,
			 n - 3);
		return -1;
	}
	for (size_t i = 0; i < (size_t)count; i++) {
		if (parse_errcode(w[n - 3 == 1 ? 3 : 3 + i], &codes[i], err,
				  errlen) != 0)
			return -1;
	}
	rd_kafka_mock_push_request_errors_array(mc, (int16_t)api_key,
						(size_t)count, codes);
	return 0;
}

static int cmd_leader(rd_kafka_mock_cluster_t *mc, int brokers, char **w,
		      size_t n, char *err, size_t errlen)
{
	long partition, id;

	if (n != 4) {
		snprintf(err, errlen, "usage: leader TOPIC PARTITION ID");
		return -1;
	}
	if (parse_long(w[2], 0, MAX_PARTITIONS - 1, &partition) != 0) {
		snprintf(err, errlen, "partition '%s' is not in 0..%d", w[2],
			 MAX_PARTITIONS - 1);
		return -1;
	}
	if (parse_long(w[3], -1, brokers, &id) != 0 || id == 0) {
		snprintf(err, errlen, "broker id '%s' is not -1 or 1..%d", w[3],
			 brokers);
		return -1;
	}
	return rerr_check(rd_kafka_mock_partition_set_leader(
			      mc, w[1], (int32_t)partition, (int32_t)id),
			  "cannot set leader", err, errlen);
}

/* Runs one control command; line is modified. */
static int command_run(rd_kafka_mock_cluster_t *mc, int brokers, char *line,
		       char *err, size_t errlen)
{
	char *w[MAX_WORDS];
	size_t n = words_split(line, w, MAX_WORDS);
	int32_t id;
	long v;

	if (n == 0) {
		snprintf(err, errlen, "empty command");
		return -1;
	}
	if ((strcmp(w[0], "broker_down") == 0 ||
	     strcmp(w[0], "broker_up") == 0) &&
	    n == 2) {
		if (broker_id_parse(w[1], brokers, &id, err, errlen) != 0)
			return -1;
		return rerr_check(
		    broker_set(mc, id, strcmp(w[0], "broker_up") == 0), w[0],
		    err, errlen);
	}
	if ((strcmp(w[0], "all_down") == 0 || strcmp(w[0], "all_up") == 0) &&
	    n == 1) {
		bool up = strcmp(w[0], "all_up") == 0;

		for (id = 1; id <= brokers; id++) {
			if (rerr_check(broker_set(mc, id, up), w[0], err,
				       errlen) != 0)
				return -1;
		}
		return 0;
	}
	if (strcmp(w[0], "rtt") == 0 && n == 3) {
		if (broker_id_parse(w[1], brokers, &id, err, errlen) != 0)
			return -1;
		if (parse_long(w[2], 0, INT_MAX, &v) != 0) {
			snprintf(err, errlen, "rtt '%s' is not a number of ms",
				 w[2]);
			return -1;
		}
		return rerr_check(rd_kafka_mock_broker_set_rtt(mc, id, (int)v),
				  "rtt", err, errlen);
	}
	if (strcmp(w[0], "push_errors") == 0)
		return cmd_push_errors(mc, w, n, err, errlen);
	if (strcmp(w[0], "clear_errors") == 0 && n == 2) {
		if (parse_long(w[1], 0, MAX_API_KEY, &v) != 0) {
			snprintf(err, errlen, "api key '%s' is not in 0..%d",
				 w[1], MAX_API_KEY);
			return -1;
		}
		rd_kafka_mock_clear_request_errors(mc, (int16_t)v);
		return 0;
	}
	if (strcmp(w[0], "topic_error") == 0 && n == 3) {
		rd_kafka_resp_err_t code;

		if (parse_errcode(w[2], &code, err, errlen) != 0)
			return -1;
		rd_kafka_mock_topic_set_error(mc, w[1], code);
		return 0;
	}
	if (strcmp(w[0], "create_topic") == 0 && n == 3) {
		if (parse_long(w[2], 1, MAX_PARTITIONS, &v) != 0) {
			snprintf(err, errlen, "partitions '%s' not in 1..%d",
				 w[2], MAX_PARTITIONS);
			return -1;
		}
		return rerr_check(
		    rd_kafka_mock_topic_create(mc, w[1], (int)v,
					       replication_factor(brokers)),
		    "cannot create topic", err, errlen);
	}
	if (strcmp(w[0], "leader") == 0)
		return cmd_leader(mc, brokers, w, n, err, errlen);
	snprintf(err, errlen, "unknown command or wrong arguments: '%s'", w[0]);
	return -1;
}

/*
 * Opens the control FIFO, creating it if missing. Opened read-write so the
 * open does not wait for a writer and we never see end-of-file when a
 * writer closes. *created tells the caller to unlink it at exit.
 */
static int control_open(const char *path, bool *created, char *err,
			size_t errlen)
{
	struct stat st;
	char ebuf[128];
	int fd;

	*created = false;
	if (mkfifo(path, 0600) == 0) {
		*created = true;
	} else if (errno != EEXIST) {
		snprintf(err, errlen, "cannot create fifo '%s': %s", path,
			 errno_str(errno, ebuf, sizeof(ebuf)));
		return -1;
	}
	fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		snprintf(err, errlen, "cannot open fifo '%s': %s", path,
			 errno_str(errno, ebuf, sizeof(ebuf)));
		return -1;
	}
	if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
		snprintf(err, errlen, "'%s' exists and is not a fifo", path);
		close(fd);
		return -1;
	}
	return fd;
}

/* Runs every complete line in lb, keeps a partial one for later. */
static void control_lines(rd_kafka_mock_cluster_t *mc, int brokers,
			  struct linebuf *lb, unsigned long *seq)
{
	char *start = lb->buf;
	char *nl;

	while (
	    (nl = memchr(start, '\n', lb->len - (size_t)(start - lb->buf)))) {
		char line[LINE_MAX_LEN];
		char work[LINE_MAX_LEN];
		char err[256] = "";
		bool too_long = lb->overflow;

		*nl = '\0';
		snprintf(line, sizeof(line), "%s", start);
		start = nl + 1;
		lb->overflow = false;
		if (too_long) {
			(*seq)++;
			printf("error %lu: (line longer than %d bytes)\n", *seq,
			       LINE_MAX_LEN - 1);
			continue;
		}
		if (strspn(line, " \t\r") == strlen(line) || line[0] == '#')
			continue;
		(*seq)++;
		/* command_run() cuts its copy into words; line is echoed. */
		snprintf(work, sizeof(work), "%s", line);
		if (command_run(mc, brokers, work, err, sizeof(err)) == 0)
			printf("ok %lu: %s\n", *seq, line);
		else
			printf("error %lu: %s: %s\n", *seq, line, err);
	}
	lb->len -= (size_t)(start - lb->buf);
	memmove(lb->buf, start, lb->len);
	if (lb->len == sizeof(lb->buf)) {
		/* No newline in a full buffer: drop it up to the next one. */
		lb->overflow = true;
		lb->len = 0;
	}
	fflush(stdout);
}

static int control_read(int fd, rd_kafka_mock_cluster_t *mc, int brokers,
			struct linebuf *lb, unsigned long *seq, char *err,
			size_t errlen)
{
	char ebuf[128];

	for (;;) {
		ssize_t got =
		    read(fd, lb->buf + lb->len, sizeof(lb->buf) - lb->len);
		if (got < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return 0;
			snprintf(err, errlen, "cannot read control fifo: %s",
				 errno_str(errno, ebuf, sizeof(ebuf)));
			return -1;
		}
		if (got == 0)
			return 0;
		lb->len += (size_t)got;
		control_lines(mc, brokers, lb, seq);
	}
}

/* Waits for SIGTERM/SIGINT on sigfd while serving the control fifo. */
static int serve(int sigfd, int ctlfd, rd_kafka_mock_cluster_t *mc, int brokers,
		 char *err, size_t errlen)
{
	struct linebuf lb = {.len = 0, .overflow = false};
	unsigned long seq = 0;
	char ebuf[128];
	struct pollfd pfd[2] = {
	    {.fd = sigfd, .events = POLLIN},
	    {.fd = ctlfd, .events = POLLIN},
	};
	nfds_t nfds = ctlfd >= 0 ? 2 : 1;

	for (;;) {
		if (poll(pfd, nfds, -1) < 0) {
			if (errno == EINTR)
				continue;
			snprintf(err, errlen, "poll failed: %s",
				 errno_str(errno, ebuf, sizeof(ebuf)));
			return -1;
		}
		if (pfd[0].revents & POLLIN)
			return 0;
		if (nfds == 2 && (pfd[1].revents & (POLLIN | POLLHUP))) {
			if (control_read(ctlfd, mc, brokers, &lb, &seq, err,
					 errlen) != 0)
				return -1;
		}
	}
}

int main(int argc, char **argv)
{
	struct options opt;
	char err[512] = "";
	char ebuf[128];
	rd_kafka_conf_t *conf = NULL;
	rd_kafka_t *rk = NULL;
	rd_kafka_mock_cluster_t *mc = NULL;
	sigset_t stop_sigs;
	int sigfd = -1;
	int ctlfd = -1;
	bool fifo_created = false;
	int ret = 1;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (options_parse(argc, argv, &opt, err, sizeof(err)) != 0) {
		fprintf(stderr, PROG ": %s (see --help)\n", err);
		return 2;
	}

	/* Blocked before rd_kafka_new() so librdkafka's threads inherit the
	 * mask and the signals reach only our signalfd. */
	sigemptyset(&stop_sigs);
	sigaddset(&stop_sigs, SIGTERM);
	sigaddset(&stop_sigs, SIGINT);
	if (sigprocmask(SIG_BLOCK, &stop_sigs, NULL) != 0) {
		snprintf(err, sizeof(err), "cannot block signals: %s",
			 errno_str(errno, ebuf, sizeof(ebuf)));
		goto out;
	}
	sigfd = signalfd(-1, &stop_sigs, SFD_CLOEXEC);
	if (sigfd < 0) {
		snprintf(err, sizeof(err), "cannot create signalfd: %s",
			 errno_str(errno, ebuf, sizeof(ebuf)));
		goto out;
	}
	if (opt.control_path) {
		ctlfd = control_open(opt.control_path, &fifo_created, err,
				     sizeof(err));
		if (ctlfd < 0)
			goto out;
	}

	conf = rd_kafka_conf_new();
	/* Hides the notice that this handle has no bootstrap.servers: it only
	 * hosts the cluster. Warnings and errors still show. */
	if (rd_kafka_conf_set(conf, "log_level", "4", err, sizeof(err)) !=
	    RD_KAFKA_CONF_OK)
		goto out;
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
	if (!rk)
		goto out; /* conf is still ours; freed below */
	conf = NULL;	  /* owned by rk now */

	mc = rd_kafka_mock_cluster_new(rk, opt.brokers);
	if (!mc) {
		snprintf(err, sizeof(err), "cannot create mock cluster");
		goto out;
	}
	if (opt.metadata_v4 &&
	    rerr_check(rd_kafka_mock_set_apiversion(mc, API_KEY_METADATA, 0, 4),
		       "cannot enable Metadata v4", err, sizeof(err)) != 0)
		goto out;
	if (topics_create(mc, &opt, err, sizeof(err)) != 0)
		goto out;

	printf("BOOTSTRAP=%s\n", rd_kafka_mock_cluster_bootstraps(mc));
	fflush(stdout);

	if (serve(sigfd, ctlfd, mc, opt.brokers, err, sizeof(err)) != 0)
		goto out;
	ret = 0;
out:
	if (ret != 0)
		fprintf(stderr, PROG ": %s\n", err);
	/* The cluster borrows rk's internals: destroy it first. */
	if (mc)
		rd_kafka_mock_cluster_destroy(mc);
	if (rk)
		rd_kafka_destroy(rk);
	if (conf)
		rd_kafka_conf_destroy(conf);
	if (ctlfd >= 0)
		close(ctlfd);
	if (fifo_created)
		unlink(opt.control_path);
	if (sigfd >= 0)
		close(sigfd);
	return ret;
}
