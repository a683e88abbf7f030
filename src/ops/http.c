/* SPDX-License-Identifier: MIT */
/* The HTTP server for /healthz, /readyz and /metrics (libmicrohttpd). */
#include "http.h"

#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"

#define LISTEN_BACKLOG 64
#define MAX_CONNECTIONS 64
#define CONNECTION_TIMEOUT_S 10

struct http_server {
	struct MHD_Daemon *daemon;
	int fd;
	http_handler handler;
	void *arg;
};

void http_reply_text(struct http_reply *reply, unsigned int status,
		     const char *text)
{
	reply->status = status;
	reply->content_type = "text/plain; charset=utf-8";
	reply->body = strdup(text);
	reply->len = reply->body ? strlen(reply->body) : 0;
	if (!reply->body)
		reply->status = MHD_HTTP_INTERNAL_SERVER_ERROR;
}

uint64_t http_warn_admit(struct http_warn_limit *l, int64_t now_ms, bool *admit)
{
	uint64_t suppressed = 0;

	if (l->window_start_ms == 0 ||
	    now_ms - l->window_start_ms >= HTTP_WARN_WINDOW_MS) {
		suppressed = l->suppressed;
		l->window_start_ms = now_ms;
		l->in_window = 0;
		l->suppressed = 0;
	}
	*admit = l->in_window < HTTP_WARN_BURST;
	if (*admit)
		l->in_window++;
	else
		l->suppressed++;
	return suppressed;
}

/* One limit for the process: every request that libmicrohttpd finds
 * malformed is a warning, and a client sending them in a loop must not
 * flood the log. warn_lock guards warn_limit (the server's thread logs;
 * a second server in tests shares the budget). */
static pthread_mutex_t warn_lock = PTHREAD_MUTEX_INITIALIZER;
static struct http_warn_limit warn_limit;

static void mhd_log(void *arg, const char *fmt, va_list ap)
{
	char line[512], count[32];
	bool admit;
	(void)arg;
	vsnprintf(line, sizeof(line), fmt, ap);
	size_t n = strlen(line);
	while (n > 0 && line[n - 1] == '\n')
		line[--n] = '\0';
	pthread_mutex_lock(&warn_lock);
	uint64_t suppressed = http_warn_admit(&warn_limit, clock_ms(), &admit);
	bool last = admit && warn_limit.in_window == HTTP_WARN_BURST;
	pthread_mutex_unlock(&warn_lock);
	if (suppressed) {
		snprintf(count, sizeof(count), "%llu",
			 (unsigned long long)suppressed);
		log_fields(LOG_WARN, "http server warnings suppressed",
			   "suppressed", count, NULL);
	}
	if (admit)
		log_fields(LOG_WARN, "http server", "error", line, NULL);
	if (last)
		log_fields(LOG_WARN,
			   "http server: further warnings are counted, not "
			   "logged, until the window ends",
			   "window", HTTP_WARN_WINDOW_TEXT, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
				  const char *url, const char *method,
				  const char *version, const char *upload_data,
				  size_t *upload_data_size, void **con_cls)
{
	struct http_server *s = cls;
	struct http_reply reply = {0};
	(void)version;
	(void)upload_data;
	(void)upload_data_size;
	(void)con_cls;

	bool allowed = strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
		       strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
	if (allowed)
		s->handler(s->arg, url, &reply);
	else
		http_reply_text(&reply, MHD_HTTP_METHOD_NOT_ALLOWED,
				"method not allowed: use GET\n");

	struct MHD_Response *resp =
	    reply.body ? MHD_create_response_from_buffer(reply.len, reply.body,
							 MHD_RESPMEM_MUST_FREE)
		       : MHD_create_response_from_buffer(
			     0, NULL, MHD_RESPMEM_PERSISTENT);
	if (!resp) {
		free(reply.body);
		return MHD_NO;
	}
	if (reply.content_type)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
					reply.content_type);
	/* Probes and scrapes must never see a cached answer. */
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
				"no-store");
	if (!allowed)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW,
					"GET, HEAD");
	enum MHD_Result rc = MHD_queue_response(
	    conn, reply.status ? reply.status : MHD_HTTP_OK, resp);
	MHD_destroy_response(resp);
	return rc;
}

/* Splits "host:port" / "[v6]:port" into host and port. */
static int split_addr(const char *addr, char *host, size_t hostlen, char *port,
		      size_t portlen)
{
	const char *colon = strrchr(addr, ':');
	if (!colon || colon == addr || colon[1] == '\0')
		return -1;
	const char *h = addr;
	size_t n = (size_t)(colon - addr);
	if (h[0] == '[') {
		if (n < 3 || h[n - 1] != ']')
			return -1;
		h++;
		n -= 2;
	}
	if (n >= hostlen || strlen(colon + 1) >= portlen)
		return -1;
	memcpy(host, h, n);
	host[n] = '\0';
	snprintf(port, portlen, "%s", colon + 1);
	return 0;
}

/* Binds and listens on the first address of addr that works. Binding
 * here rather than in libmicrohttpd gives the operator the real reason
 * (address in use, permission denied) instead of a bare failure. */
static int listen_on(const char *addr, int *family, char *err, size_t errlen)
{
	char host[256], port[16];
	struct addrinfo hints = {0}, *ai = NULL;
	int fd = -1;
	if (split_addr(addr, host, sizeof(host), port, sizeof(port)) != 0) {
		snprintf(err, errlen,
			 "OUTBOX_HTTP_ADDR '%s': must be host:port", addr);
		return -1;
	}
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
	int rc = getaddrinfo(host, port, &hints, &ai);
	if (rc != 0) {
		snprintf(err, errlen, "http: cannot resolve '%s': %s", addr,
			 gai_strerror(rc));
		return -1;
	}
	int saved = 0;
	for (struct addrinfo *a = ai; a; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC,
			    a->ai_protocol);
		if (fd < 0) {
			saved = errno;
			continue;
		}
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
		    listen(fd, LISTEN_BACKLOG) == 0) {
			*family = a->ai_family;
			break;
		}
		saved = errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	char why[128];
	if (fd < 0) {
		snprintf(err, errlen, "http: cannot listen on %s: %s", addr,
			 strerror_r(saved, why, sizeof(why)));
		return -1;
	}
	int flags = fcntl(fd, F_GETFL);
	if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
		snprintf(err, errlen, "http: cannot configure socket: %s",
			 strerror_r(errno, why, sizeof(why)));
		close(fd);
		return -1;
	}
	return fd;
}

int http_start(struct http_server **out, const char *addr, http_handler handler,
	       void *arg, char *err, size_t errlen)
{
	int family = AF_INET;
	*out = NULL;
	struct http_server *s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "http: out of memory");
		return -1;
	}
	s->handler = handler;
	s->arg = arg;
	s->fd = listen_on(addr, &family, err, errlen);
	if (s->fd < 0) {
		free(s);
		return -1;
	}
	unsigned int flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
	if (family == AF_INET6)
		flags |= MHD_USE_IPv6;
	/* The logger goes first so start-up messages reach it too. */
	s->daemon = MHD_start_daemon(
	    flags, 0, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER,
	    mhd_log, NULL, MHD_OPTION_LISTEN_SOCKET, s->fd,
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)MAX_CONNECTIONS,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)CONNECTION_TIMEOUT_S,
	    MHD_OPTION_END);
	if (!s->daemon) {
		snprintf(err, errlen, "http: cannot start the server on %s",
			 addr);
		close(s->fd);
		free(s);
		return -1;
	}
	*out = s;
	return 0;
}

int http_port(const struct http_server *s)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	if (!s || getsockname(s->fd, (struct sockaddr *)&ss, &len) != 0)
		return -1;
	char port[16];
	if (getnameinfo((struct sockaddr *)&ss, len, NULL, 0, port,
			sizeof(port), NI_NUMERICSERV) != 0)
		return -1;
	return (int)strtol(port, NULL, 10);
}

void http_stop(struct http_server *s)
{
	if (!s)
		return;
	/* MHD_stop_daemon closes a listen socket it was given. */
	MHD_stop_daemon(s->daemon);
	free(s);
}
