/* SPDX-License-Identifier: MIT */
/* Hiding passwords in connection URLs and libpq key=value strings. */
#include "config.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Appends to a fixed buffer, truncating, always leaving room for NUL. */
struct outbuf {
	char *p;
	size_t len, cap;
};

static void ob_put(struct outbuf *o, const char *s, size_t n)
{
	size_t room = o->cap - 1 - o->len;

	if (n > room)
		n = room;
	memcpy(o->p + o->len, s, n);
	o->len += n;
	o->p[o->len] = '\0';
}

static bool is_password_key(const char *key, size_t n)
{
	static const char word[] = "password";
	size_t k = sizeof(word) - 1;

	for (size_t i = 0; i + k <= n; i++)
		if (strncasecmp(key + i, word, k) == 0)
			return true;
	return false;
}

static bool is_hex(char c)
{
	return isxdigit((unsigned char)c) != 0;
}

static int hex_value(char c)
{
	return isdigit((unsigned char)c) ? c - '0'
					 : tolower((unsigned char)c) - 'a' + 10;
}

/* A query key as libpq reads it: percent-decoded ("pass%77ord" sets the
 * password). One too long to decode here counts as a password's. */
static bool is_password_query_key(const char *key, size_t n)
{
	char plain[256];
	size_t len = 0;

	for (size_t i = 0; i < n; i++) {
		if (len == sizeof(plain))
			return true;
		if (key[i] == '%' && i + 2 < n && is_hex(key[i + 1]) &&
		    is_hex(key[i + 2])) {
			plain[len++] = (char)(hex_value(key[i + 1]) * 16 +
					      hex_value(key[i + 2]));
			i += 2;
		} else {
			plain[len++] = key[i];
		}
	}
	return is_password_key(plain, len);
}

/*
 * key=value pairs after '?' in a URI. Split on '&' only: a '#' inside an
 * unescaped password must not end the redaction early.
 */
static void redact_query(struct outbuf *o, const char *q)
{
	for (;;) {
		size_t n = strcspn(q, "&");
		const char *eq = memchr(q, '=', n);

		if (eq && is_password_query_key(q, (size_t)(eq - q))) {
			ob_put(o, q, (size_t)(eq - q) + 1);
			ob_put(o, "***", 3);
		} else {
			ob_put(o, q, n);
		}
		q += n;
		if (*q == '\0')
			break;
		ob_put(o, q++, 1);
	}
}

/* "host[:port]" items separated by ',' (libpq's multi-host form); a
 * host may be an IPv6 literal in brackets. */
static bool host_list_ok(const char *h, size_t n)
{
	const char *end = h + n;

	while (h <= end) {
		const char *item_end = memchr(h, ',', (size_t)(end - h));
		const char *p = h, *port = NULL;

		if (!item_end)
			item_end = end;
		if (p < item_end && *p == '[') {
			p = memchr(p, ']', (size_t)(item_end - p));
			if (!p)
				return false;
			if (p + 1 < item_end && p[1] != ':')
				return false;
			port = p + 1 < item_end ? p + 2 : NULL;
		} else {
			port = memchr(p, ':', (size_t)(item_end - p));
			if (port)
				port++;
		}
		for (; port && port < item_end; port++)
			if (!isdigit((unsigned char)*port))
				return false;
		h = item_end + 1;
	}
	return true;
}

/*
 * Where the user and password of a URL end (see config_url_userinfo_check
 * for the rule): sets *at to the '@' ending them, NULL when there are
 * none. Returns NULL, or what makes the URL ambiguous.
 */
static const char *userinfo_end(const char *auth, const char **at)
{
	size_t q = strcspn(auth, "?");
	size_t slash = strcspn(auth, "/");
	/* The authority, as libpq reads it, ends at the first '/'. */
	const char *first = memchr(auth, '@', slash < q ? slash : q);

	*at = NULL;
	if (slash > q && strchr(auth + q, '@'))
		return "an '@' after a '?' that comes before any '/': "
		       "percent-encode '?' in the user or password (%3F), or "
		       "write the query after a '/'";
	if (!first) {
		/* No user: an '@' is in the database name or the query,
		 * unless what stands before the '/' is no host list, when
		 * it is a password holding a '/'. */
		if (strchr(auth, '@') && !host_list_ok(auth, slash))
			return "a '/' before the '@': percent-encode '/' and "
			       "'?' in the user or password (%2F, %3F)";
		/* And one in the database name is refused too, for
		 * "u:/pw@host/db" (a password starting with '/', or
		 * "u:2024/pw@...") reads as host u, port 2024 and database
		 * "pw@host/db", and would be printed as holding no password.
		 * An '@' in the query is the query's. */
		if (slash < q && memchr(auth + slash, '@', q - slash))
			return "an '@' after the first '/': if it ends a "
			       "password that holds a '/', percent-encode "
			       "the '/' (%2F); in a database name, write the "
			       "'@' as %40";
		return NULL;
	}
	if (memchr(first + 1, '@', slash - (size_t)(first + 1 - auth)))
		return "more than one '@' before the host: percent-encode "
		       "'@' in the user or password (%40)";
	for (const char *p = auth; p < first; p++)
		if (*p == '%' &&
		    (p + 2 >= first || !is_hex(p[1]) || !is_hex(p[2])))
			return "a '%' not followed by two hex digits in the "
			       "user "
			       "or password: write '%' as %25";
	*at = first;
	return NULL;
}

static void redact_uri(struct outbuf *o, const char *url, const char *sep)
{
	const char *auth = sep + 3;
	const char *at;
	/* A URL config refused never gets here, but if one does, hide up to
	 * the last '@': too much rather than a part of the password. */
	if (userinfo_end(auth, &at))
		at = strrchr(auth, '@');
	const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
	const char *rest = auth;
	const char *q;

	ob_put(o, url, (size_t)(auth - url));
	if (colon) {
		ob_put(o, auth, (size_t)(colon - auth) + 1);
		ob_put(o, "***", 3);
		rest = at;
	}
	q = strchr(rest, '?');
	if (!q) {
		ob_put(o, rest, strlen(rest));
		return;
	}
	ob_put(o, rest, (size_t)(q - rest) + 1);
	redact_query(o, q + 1);
}

/* libpq key = value pairs; values may be 'quoted' and use \ escapes. */
static void redact_conninfo(struct outbuf *o, const char *s)
{
	while (*s) {
		size_t ws = strspn(s, " \t\r\n\f\v");
		const char *key, *v;
		size_t keylen;
		bool hide;

		ob_put(o, s, ws);
		s += ws;
		if (*s == '\0')
			break;
		key = s;
		keylen = strcspn(s, "= \t\r\n\f\v");
		s += keylen;
		s += strspn(s, " \t\r\n\f\v");
		if (*s != '=') {
			/* Not key=value: copy the word and go on. */
			ob_put(o, key, (size_t)(s - key));
			continue;
		}
		s++;
		s += strspn(s, " \t\r\n\f\v");
		hide = is_password_key(key, keylen);
		ob_put(o, key, (size_t)(s - key));
		v = s;
		if (*s == '\'') {
			for (s++; *s && *s != '\''; s++)
				if (*s == '\\' && s[1])
					s++;
			if (*s == '\'')
				s++;
		} else {
			for (; *s && !isspace((unsigned char)*s); s++)
				if (*s == '\\' && s[1])
					s++;
		}
		if (hide)
			ob_put(o, "***", 3);
		else
			ob_put(o, v, (size_t)(s - v));
	}
}

/* "scheme://" where scheme is [A-Za-z][A-Za-z0-9+.-]*; else NULL. */
static const char *uri_scheme_end(const char *url)
{
	size_t n;

	if (!isalpha((unsigned char)url[0]))
		return NULL;
	n = strspn(url, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
			"0123456789+.-");
	return strncmp(url + n, "://", 3) == 0 ? url + n : NULL;
}

int config_url_userinfo_check(const char *url, char *why, size_t whylen)
{
	const char *sep = url ? uri_scheme_end(url) : NULL;
	const char *at, *problem;

	if (!sep)
		return 0;
	problem = userinfo_end(sep + 3, &at);
	if (!problem)
		return 0;
	snprintf(why, whylen, "ambiguous URL, %s", problem);
	return -1;
}

void config_redact_url(const char *url, char *out, size_t outlen)
{
	struct outbuf o = {.p = out, .len = 0, .cap = outlen};
	const char *sep;

	if (!out || outlen == 0)
		return;
	out[0] = '\0';
	if (!url)
		return;
	sep = uri_scheme_end(url);
	if (sep)
		redact_uri(&o, url, sep);
	else
		redact_conninfo(&o, url);
}
