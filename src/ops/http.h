/* SPDX-License-Identifier: MIT */
/*
 * A small HTTP server (libmicrohttpd, one internal polling thread) that
 * hands every GET or HEAD request to one handler; other methods get 405.
 * It knows nothing about the relay: ops.c supplies the endpoints.
 *
 * Threads: the handler runs on the server's thread, one request at a
 * time, and must only read shared state that is safe to read there
 * (atomics). Start the server with signals blocked so its thread
 * inherits the mask.
 */
#ifndef OUTBOX_HTTP_H
#define OUTBOX_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A reply the handler fills in. body is malloc'd (or NULL for empty) and
 * owned by the server once the handler returns. */
struct http_reply {
	unsigned int status;
	const char *content_type; /* static string */
	char *body;
	size_t len;
};

typedef void (*http_handler)(void *arg, const char *path,
			     struct http_reply *reply);

struct http_server;

/*
 * Listens on addr ("host:port", "[v6]:port"; host may be a name) and
 * serves until http_stop(). Returns 0 with *out set, or -1 with err
 * naming the address and the reason (e.g. the port is taken).
 */
int http_start(struct http_server **out, const char *addr, http_handler handler,
	       void *arg, char *err, size_t errlen);

/* The port actually bound (useful when addr asked for port 0). */
int http_port(const struct http_server *s);

/* Stops serving, closes the socket and frees s; NULL is fine. */
void http_stop(struct http_server *s);

/*
 * Warnings of the server (a malformed request each) are rate-limited: at
 * most HTTP_WARN_BURST per HTTP_WARN_WINDOW_MS; the rest are counted, and
 * the count is logged as one "suppressed" line with the first warning of
 * a later window.
 */
#define HTTP_WARN_BURST 10
#define HTTP_WARN_WINDOW_MS 10000
#define HTTP_WARN_WINDOW_TEXT "10s"

struct http_warn_limit {
	int64_t window_start_ms; /* 0: no window yet */
	int in_window;		 /* warnings logged in this window */
	uint64_t suppressed;	 /* warnings dropped in this window */
};

/* One warning at now_ms: sets *admit when it may be logged, and returns
 * how many were suppressed in the window that just ended (0 when the
 * window goes on), to be logged first. */
uint64_t http_warn_admit(struct http_warn_limit *l, int64_t now_ms,
			 bool *admit);

/* Sets reply to status with a copy of the text as a text/plain body. */
void http_reply_text(struct http_reply *reply, unsigned int status,
		     const char *text);

#endif
