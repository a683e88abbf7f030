/* SPDX-License-Identifier: MIT */
/* Line-oriented logging, JSON or text, with a per-thread name. */
#include "base.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Set once by log_setup() before any thread starts; read-only after. */
static enum log_level log_threshold = LOG_INFO;
static bool log_json = true;

static _Thread_local char log_thread[48];

static const char *const level_names[] = {"debug", "info", "warn", "error"};

void log_setup(enum log_level level, bool json)
{
	log_threshold = level;
	log_json = json;
}

int log_level_parse(const char *s)
{
	for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]);
	     i++)
		if (strcmp(s, level_names[i]) == 0)
			return (int)i;
	if (strcmp(s, "warning") == 0)
		return LOG_WARN;
	return -1;
}

void log_set_thread(const char *name)
{
	snprintf(log_thread, sizeof(log_thread), "%s", name);
}

bool log_enabled(enum log_level level)
{
	return level >= log_threshold;
}

/* What a line's end needs whatever came before: a JSON string's closing
 * quote, the object's brace, the newline. */
#define LINE_END_ROOM 4

struct line {
	char buf[4096];
	size_t len;
	/* A piece did not fit: nothing more is written but the ends. */
	bool cut;
};

/* The piece s[0..n) whole, or (in JSON) nothing: a piece is one escape or
 * one UTF-8 character at most, so a long line cut short stays valid
 * JSON and UTF-8. Text keeps what fits. */
static void line_put(struct line *l, const char *s, size_t n)
{
	size_t room = sizeof(l->buf) - LINE_END_ROOM - l->len;
	if (l->cut)
		return;
	if (n > room) {
		l->cut = true;
		if (log_json)
			return;
		n = room;
	}
	memcpy(l->buf + l->len, s, n);
	l->len += n;
}

/* One of the line's ends, into the room kept for it. */
static void line_end(struct line *l, char c)
{
	if (l->len < sizeof(l->buf))
		l->buf[l->len++] = c;
}

/* The length of the UTF-8 sequence s starts (1 for anything else, cut
 * short by the string's end). */
static size_t utf8_piece(const char *s)
{
	unsigned char c = (unsigned char)s[0];
	size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1, n = 1;
	while (n < want && ((unsigned char)s[n] & 0xC0) == 0x80)
		n++;
	return n;
}

static void line_puts(struct line *l, const char *s)
{
	line_put(l, s, strlen(s));
}

/* JSON string escaping (RFC 8259: every C0 control character). A string
 * begun is closed, cut short or not. */
static void line_json_string(struct line *l, const char *s)
{
	line_put(l, "\"", 1);
	if (l->cut)
		return;
	for (; *s && !l->cut; s++) {
		unsigned char c = (unsigned char)*s;
		char esc[8];
		switch (c) {
		case '"':
			line_put(l, "\\\"", 2);
			break;
		case '\\':
			line_put(l, "\\\\", 2);
			break;
		case '\n':
			line_put(l, "\\n", 2);
			break;
		case '\t':
			line_put(l, "\\t", 2);
			break;
		case '\r':
			line_put(l, "\\r", 2);
			break;
		default:
			if (c < 0x20) {
				snprintf(esc, sizeof(esc), "\\u%04x", c);
				line_puts(l, esc);
			} else {
				size_t n = utf8_piece(s);
				line_put(l, s, n);
				s += n - 1;
			}
		}
	}
	line_end(l, '"');
}

/*
 * Text mode: the value as it is, except control characters (C0 and DEL),
 * written as \n, \r, \t or \xHH, so no value (a row's exchange, a
 * broker's or a client's text) can start a forged line or hide part of
 * one behind a carriage return.
 */
static void line_text(struct line *l, const char *s)
{
	while (*s) {
		size_t n = 0;
		char esc[8];

		while (s[n] && (unsigned char)s[n] >= 0x20 && s[n] != 0x7f)
			n++;
		line_put(l, s, n);
		s += n;
		if (*s == '\0')
			break;
		switch (*s) {
		case '\n':
			line_put(l, "\\n", 2);
			break;
		case '\r':
			line_put(l, "\\r", 2);
			break;
		case '\t':
			line_put(l, "\\t", 2);
			break;
		default:
			snprintf(esc, sizeof(esc), "\\x%02x",
				 (unsigned)(unsigned char)*s);
			line_puts(l, esc);
		}
		s++;
	}
}

static void line_field(struct line *l, const char *key, const char *value)
{
	if (log_json) {
		/* A field whose name does not fit is left out whole. */
		if (l->cut ||
		    l->len + strlen(key) + 6 + LINE_END_ROOM > sizeof(l->buf)) {
			l->cut = true;
			return;
		}
		line_put(l, ",", 1);
		line_json_string(l, key);
		line_put(l, ":", 1);
		line_json_string(l, value);
	} else {
		line_put(l, " ", 1);
		line_puts(l, key);
		line_put(l, "=", 1);
		line_text(l, value);
	}
}

static void log_write(enum log_level level, const char *msg, va_list fields)
{
	struct line l = {.len = 0};
	char ts[40];
	struct timespec now;
	struct tm tm;

	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	size_t n = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(ts + n, sizeof(ts) - n, ".%03ldZ", now.tv_nsec / 1000000);

	if (log_json) {
		line_puts(&l, "{\"ts\":\"");
		line_puts(&l, ts);
		line_puts(&l, "\",\"level\":\"");
		line_puts(&l, level_names[level]);
		line_puts(&l, "\",\"msg\":");
		line_json_string(&l, msg);
	} else {
		line_puts(&l, ts);
		line_put(&l, " ", 1);
		line_puts(&l, level_names[level]);
		line_put(&l, " ", 1);
		line_text(&l, msg);
	}
	if (log_thread[0])
		line_field(&l, "thread", log_thread);
	for (;;) {
		const char *key = va_arg(fields, const char *);
		if (!key)
			break;
		const char *value = va_arg(fields, const char *);
		line_field(&l, key, value ? value : "");
	}
	if (log_json)
		line_end(&l, '}');
	line_end(&l, '\n');
	fwrite(l.buf, 1, l.len, stderr);
}

void log_fields(enum log_level level, const char *msg, ...)
{
	if (!log_enabled(level))
		return;
	va_list ap;
	va_start(ap, msg);
	log_write(level, msg, ap);
	va_end(ap);
}

static void log_write_none(enum log_level level, const char *msg, ...)
{
	va_list ap;
	va_start(ap, msg);
	log_write(level, msg, ap);
	va_end(ap);
}

void log_msg(enum log_level level, const char *fmt, ...)
{
	if (!log_enabled(level))
		return;
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_write_none(level, msg, (const char *)NULL);
}
