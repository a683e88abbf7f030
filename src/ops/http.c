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
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/base.h"

#define LISTEN_BACKLOG 256
/* Connections served at once, and from one client address. A newcomer
 * past either limit takes the place of the connection that has waited
 * longest for its request to arrive (a slow or idle client): probes and
 * scrapes send their request at once, so they are never the ones closed,
 * and a slow client cannot keep /healthz out (see docs/operations.md). */
#define MAX_CONNECTIONS 64
#define MAX_PER_ADDRESS 16
/* libmicrohttpd's own limit sits above ours: room for the connections
 * closed to make way, until the server has finished closing them. */
#define HARD_CONNECTIONS 256
/* A connection that sends nothing for this long is closed. */
#define CONNECTION_TIMEOUT_S 5
/* A request whose header has not fully arrived this long after the
 * connection opened (or its previous request ended) is closed when the
 * next connection arrives: a client dribbling a header line every few
 * seconds defeats the idle timeout alone. */
#define HEADER_DEADLINE_MS 5000

/* One connection the server holds. */
struct conn_slot {
	bool used;
	bool in_request; /* its request header arrived; being answered */
	bool evicted;	 /* shut down; the server has yet to close it */
	int fd;
	int64_t
	    waiting_since; /* clock_ms(): opened, or previous request done */
	struct sockaddr_storage addr;
};

/*
 * Threads: libmicrohttpd calls every callback below (accept policy,
 * connection and request notifications, the handler) on its one
 * internal thread, so slots needs no lock.
 */
struct http_server {
	struct MHD_Daemon *daemon;
	int fd;
	http_handler handler;
	void *arg;
	struct conn_slot slots[HARD_CONNECTIONS];
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

/* ---- admission: a slow client cannot crowd out the probes ---- */

static bool same_address(const struct sockaddr *a, const struct sockaddr *b)
{
	if (a->sa_family != b->sa_family)
		return false;
	if (a->sa_family == AF_INET)
		return memcmp(&((const struct sockaddr_in *)a)->sin_addr,
			      &((const struct sockaddr_in *)b)->sin_addr,
			      sizeof(struct in_addr)) == 0;
	if (a->sa_family == AF_INET6)
		return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
			      &((const struct sockaddr_in6 *)b)->sin6_addr,
			      sizeof(struct in6_addr)) == 0;
	return false;
}

/* Shutting the socket down makes the server read end-of-file and close
 * the connection on its next pass; its slot is freed then. */
static void evict(struct conn_slot *c)
{
	shutdown(c->fd, SHUT_RDWR);
	c->evicted = true;
}

static bool live(const struct conn_slot *c)
{
	return c->used && !c->evicted;
}

/* The live connection (of addr, when not NULL) that has waited longest
 * for its request, or NULL when every one is being answered. */
static struct conn_slot *longest_waiting(struct http_server *s,
					 const struct sockaddr *addr)
{
	struct conn_slot *best = NULL;

	for (size_t i = 0; i < HARD_CONNECTIONS; i++) {
		struct conn_slot *c = &s->slots[i];

		if (!live(c) || c->in_request ||
		    (addr && !same_address((struct sockaddr *)&c->addr, addr)))
			continue;
		if (!best || c->waiting_since < best->waiting_since)
			best = c;
	}
	return best;
}

/* Makes room for a new connection from addr, or refuses it when every
 * connection in its way is being answered. */
static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr,
				 socklen_t addrlen)
{
	struct http_server *s = cls;
	int64_t now = clock_ms();
	size_t total = 0, mine = 0;
	struct conn_slot *victim;
	(void)addrlen;

	for (size_t i = 0; i < HARD_CONNECTIONS; i++) {
		struct conn_slot *c = &s->slots[i];

		if (live(c) && !c->in_request &&
		    now - c->waiting_since > HEADER_DEADLINE_MS)
			evict(c);
		if (!live(c))
			continue;
		total++;
		mine += same_address((struct sockaddr *)&c->addr, addr);
	}
	if (mine >= MAX_PER_ADDRESS) {
		victim = longest_waiting(s, addr);
		if (!victim)
			return MHD_NO;
		evict(victim);
		total--;
	}
	if (total >= MAX_CONNECTIONS) {
		victim = longest_waiting(s, NULL);
		if (!victim)
			return MHD_NO;
		evict(victim);
	}
	return MHD_YES;
}

static void on_connection(void *cls, struct MHD_Connection *conn,
			  void **socket_context,
			  enum MHD_ConnectionNotificationCode toe)
{
	struct http_server *s = cls;
	const union MHD_ConnectionInfo *fd, *addr;
	struct conn_slot *c = *socket_context;

	if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
		if (c)
			*c = (struct conn_slot){0};
		*socket_context = NULL;
		return;
	}
	fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	addr =
	    MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	for (size_t i = 0; fd && addr && i < HARD_CONNECTIONS; i++) {
		c = &s->slots[i];
		if (c->used)
			continue;
		*c = (struct conn_slot){.used = true,
					.fd = fd->connect_fd,
					.waiting_since = clock_ms()};
		memcpy(&c->addr, addr->client_addr,
		       addr->client_addr->sa_family == AF_INET6
			   ? sizeof(struct sockaddr_in6)
			   : sizeof(struct sockaddr_in));
		*socket_context = c;
		return;
	}
}

static struct conn_slot *slot_of(struct MHD_Connection *conn)
{
	const union MHD_ConnectionInfo *ci =
	    MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);

	return ci ? ci->socket_context : NULL;
}

/* A kept-alive connection waits for its next request from now on. */
static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct conn_slot *c = slot_of(conn);
	(void)cls;
	(void)con_cls;
	(void)toe;

	if (c) {
		c->in_request = false;
		c->waiting_since = clock_ms();
	}
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

	struct conn_slot *slot = slot_of(conn);
	if (slot)
		slot->in_request = true;
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
	    flags, 0, on_accept, s, on_request, s, MHD_OPTION_EXTERNAL_LOGGER,
	    mhd_log, NULL, MHD_OPTION_LISTEN_SOCKET, s->fd,
	    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)HARD_CONNECTIONS,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)CONNECTION_TIMEOUT_S,
	    MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
	    MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
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
