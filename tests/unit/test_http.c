/* SPDX-License-Identifier: MIT */
/*
 * The HTTP server on loopback: the handler sees the path, methods other
 * than GET and HEAD get 405, a taken port is a clear error.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "capture.h"
#include "ops/http.h"

static void echo_handler(void *arg, const char *path, struct http_reply *r)
{
	int *calls = arg;
	char text[256];
	(*calls)++;
	if (strcmp(path, "/missing") == 0) {
		http_reply_text(r, 404, "not here\n");
		return;
	}
	snprintf(text, sizeof(text), "path=%s\n", path);
	http_reply_text(r, 200, text);
	r->content_type = "text/plain; version=0.0.4";
}

/* Sends request to 127.0.0.1:port and returns the whole response. */
static char *roundtrip(int port, const char *request)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fd >= 0);
	struct sockaddr_in sa = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port)};
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	size_t len = strlen(request);
	assert_int_equal(write(fd, request, len), (ssize_t)len);
	size_t cap = 4096, n = 0;
	char *buf = malloc(cap);
	assert_non_null(buf);
	for (;;) {
		ssize_t got = read(fd, buf + n, cap - n - 1);
		assert_true(got >= 0);
		if (got == 0)
			break;
		n += (size_t)got;
		assert_true(n < cap - 1);
	}
	buf[n] = '\0';
	close(fd);
	return buf;
}

/* The limiter itself, on a clock of its own: a burst, then counting,
 * then the count handed back once, with the first warning of a later
 * window. */
static void test_warn_limit(void **state)
{
	(void)state;
	struct http_warn_limit l = {0};
	bool admit;
	int64_t t = 1000;
	for (int i = 0; i < HTTP_WARN_BURST; i++) {
		assert_int_equal(http_warn_admit(&l, t + i, &admit), 0);
		assert_true(admit);
	}
	for (int i = 0; i < 25; i++) {
		assert_int_equal(http_warn_admit(&l, t + 100 + i, &admit), 0);
		assert_false(admit);
	}
	/* Still the same window, a moment before it ends. */
	assert_int_equal(
	    http_warn_admit(&l, t + HTTP_WARN_WINDOW_MS - 1, &admit), 0);
	assert_false(admit);
	/* The next window: 26 were suppressed, this one is logged. */
	t += HTTP_WARN_WINDOW_MS;
	assert_int_equal(http_warn_admit(&l, t, &admit), 26);
	assert_true(admit);
	assert_int_equal(http_warn_admit(&l, t + 1, &admit), 0);
	assert_true(admit);
	/* A quiet window in between hands back nothing. */
	t += 5 * HTTP_WARN_WINDOW_MS;
	assert_int_equal(http_warn_admit(&l, t, &admit), 0);
	assert_true(admit);
}

#define FLOOD 200

static void flood(void *arg)
{
	int port = *(int *)arg;
	for (int i = 0; i < FLOOD; i++) {
		char *resp = roundtrip(port, "GET / HTTP/1.1\r\nHost\r\n\r\n");
		assert_non_null(strstr(resp, "HTTP/1.1 400"));
		free(resp);
	}
}

static size_t count(const char *s, const char *what)
{
	size_t n = 0;
	for (const char *p = s; (p = strstr(p, what)); p += strlen(what))
		n++;
	return n;
}

/* A client sending malformed requests in a loop gets its 400s, and the
 * log gets at most the burst and one line saying the rest is counted. */
static void test_malformed_flood(void **state)
{
	(void)state;
	int calls = 0;
	char err[256];
	struct http_server *s = NULL;
	log_setup(LOG_INFO, false);
	assert_int_equal(http_start(&s, "127.0.0.1:0", echo_handler, &calls,
				    err, sizeof(err)),
			 0);
	int port = http_port(s);
	char *out = capture_stderr(flood, &port);
	http_stop(s);
	size_t warnings = count(out, " warn http server error=");
	print_message("%zu warnings for %d malformed requests\n", warnings,
		      FLOOD);
	assert_true(warnings >= 1);
	assert_true(warnings <= HTTP_WARN_BURST);
	assert_true(count(out, "further warnings are counted") <= 1);
	assert_true(count(out, "\n") <= HTTP_WARN_BURST + 2);
	assert_int_equal(calls, 0);
	free(out);
}

static void test_get_reaches_handler(void **state)
{
	(void)state;
	int calls = 0;
	char err[256];
	struct http_server *s = NULL;
	assert_int_equal(http_start(&s, "127.0.0.1:0", echo_handler, &calls,
				    err, sizeof(err)),
			 0);
	int port = http_port(s);
	assert_true(port > 0);

	char *resp = roundtrip(port, "GET /metrics?x=1 HTTP/1.1\r\nHost: t\r\n"
				     "Connection: close\r\n\r\n");
	assert_non_null(strstr(resp, "HTTP/1.1 200"));
	assert_non_null(strstr(resp, "path=/metrics\n"));
	assert_non_null(
	    strstr(resp, "Content-Type: text/plain; version=0.0.4"));
	assert_non_null(strstr(resp, "Cache-Control: no-store"));
	free(resp);

	resp = roundtrip(port, "GET /missing HTTP/1.1\r\nHost: t\r\n"
			       "Connection: close\r\n\r\n");
	assert_non_null(strstr(resp, "HTTP/1.1 404"));
	free(resp);

	/* HEAD answers like GET without the body. */
	resp = roundtrip(port, "HEAD /x HTTP/1.1\r\nHost: t\r\n"
			       "Connection: close\r\n\r\n");
	assert_non_null(strstr(resp, "HTTP/1.1 200"));
	assert_null(strstr(resp, "path=/x"));
	free(resp);
	assert_int_equal(calls, 3);

	resp =
	    roundtrip(port, "POST /x HTTP/1.1\r\nHost: t\r\n"
			    "Content-Length: 0\r\nConnection: close\r\n\r\n");
	assert_non_null(strstr(resp, "HTTP/1.1 405"));
	assert_non_null(strstr(resp, "Allow: GET, HEAD"));
	free(resp);
	assert_int_equal(calls, 3);
	http_stop(s);
}

static void test_taken_port_is_an_error(void **state)
{
	(void)state;
	int calls = 0;
	char err[256], addr[64];
	struct http_server *s = NULL, *t = NULL;
	assert_int_equal(http_start(&s, "127.0.0.1:0", echo_handler, &calls,
				    err, sizeof(err)),
			 0);
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", http_port(s));
	assert_int_equal(
	    http_start(&t, addr, echo_handler, &calls, err, sizeof(err)), -1);
	assert_null(t);
	assert_non_null(strstr(err, addr));
	assert_non_null(strstr(err, "in use"));
	http_stop(s);

	/* Stopping released the port: it can be bound again. */
	assert_int_equal(
	    http_start(&t, addr, echo_handler, &calls, err, sizeof(err)), 0);
	http_stop(t);
	http_stop(NULL);
}

static void test_bad_addresses(void **state)
{
	(void)state;
	int calls = 0;
	char err[256];
	struct http_server *s = NULL;
	const char *bad[] = {"nohost", ":9090", "127.0.0.1:", "[::1:9090",
			     "no-such-host.invalid:9090"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(http_start(&s, bad[i], echo_handler, &calls,
					    err, sizeof(err)),
				 -1);
		assert_null(s);
		assert_true(strlen(err) > 0);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_get_reaches_handler),
	    cmocka_unit_test(test_warn_limit),
	    cmocka_unit_test(test_malformed_flood),
	    cmocka_unit_test(test_taken_port_is_an_error),
	    cmocka_unit_test(test_bad_addresses),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
