/* SPDX-License-Identifier: MIT */
/*
 * Logging: one line per message to stderr, JSON objects ({"ts","level",
 * "msg", fields...}) or plain text. Each thread may name itself once
 * (log_set_thread) and every line it writes carries that name, so a
 * worker's lines say which worker wrote them.
 *
 * Thread safety: lines are written with one fputs under the stdio lock,
 * so lines from different threads never interleave. The level and format
 * are set once at startup, before threads start.
 */
#ifndef OUTBOX_LOG_H
#define OUTBOX_LOG_H

#include <stdbool.h>

enum log_level { LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR };

void log_setup(enum log_level level, bool json);
/* Parses "debug", "info", "warn", "error"; returns -1 when unknown. */
int log_level_parse(const char *s);
/* Names the calling thread in its log lines; name is copied. */
void log_set_thread(const char *name);
bool log_enabled(enum log_level level);

/*
 * Writes msg at level with extra string fields given as key, value pairs
 * ending with NULL: log_fields(LOG_WARN, "lost lease", "id", id, NULL).
 */
void log_fields(enum log_level level, const char *msg, ...)
    __attribute__((sentinel));

/* printf-style message without fields. */
void log_msg(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define log_debug(...)                                                         \
	do {                                                                   \
		if (log_enabled(LOG_DEBUG))                                    \
			log_msg(LOG_DEBUG, __VA_ARGS__);                       \
	} while (0)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif
