/* SPDX-License-Identifier: MIT */
/*
 * RFC 3986 URI-reference syntax, for the CloudEvents `source` attribute
 * (CloudEvents 1.0 types it URI-reference). Only the syntax is checked:
 * a consumer that parses the source as a URI must not be the first to
 * find out it is not one (docs/security.md).
 */
#include "encode/encode.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static bool is_alpha(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static bool is_unreserved(unsigned char c)
{
	return is_alpha(c) || isdigit(c) || c == '-' || c == '.' || c == '_' ||
	       c == '~';
}

static bool is_sub_delim(unsigned char c)
{
	return c != '\0' && strchr("!$&'()*+,;=", c) != NULL;
}

/*
 * Checks s[0..n) against one of the character sets of RFC 3986 §3: the
 * unreserved and sub-delims characters, percent-encodings, and extra.
 * Returns NULL, or what is wrong.
 */
static const char *chars_problem(const char *s, size_t n, const char *extra,
				 const char *part, char *why, size_t whylen)
{
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '%') {
			if (i + 2 >= n)
				goto bad_pct;
			if (!isxdigit((unsigned char)s[i + 1]) ||
			    !isxdigit((unsigned char)s[i + 2]))
				goto bad_pct;
			i += 2;
			continue;
		}
		if (is_unreserved(c) || is_sub_delim(c) ||
		    (c != '\0' && strchr(extra, c)))
			continue;
		if (c == ' ')
			snprintf(why, whylen, "a space in the %s", part);
		else if (c < 0x20 || c == 0x7f)
			snprintf(why, whylen, "a control character in the %s",
				 part);
		else if (c >= 0x80)
			snprintf(why, whylen,
				 "a non-ASCII byte in the %s (percent-encode "
				 "it)",
				 part);
		else
			snprintf(why, whylen, "'%c' in the %s", c, part);
		return why;
	}
	return NULL;
bad_pct:
	snprintf(why, whylen, "a '%%' not followed by two hex digits in the %s",
		 part);
	return why;
}

/* host = IP-literal / IPv4address / reg-name; the IP literal's inside is
 * only checked for its characters. */
static const char *host_problem(const char *s, size_t n, char *why,
				size_t whylen)
{
	if (n > 0 && s[0] == '[') {
		if (n < 3 || s[n - 1] != ']') {
			snprintf(why, whylen, "an unclosed '[' in the host");
			return why;
		}
		/* IPv6address or IPvFuture: hex digits, ':', '.', and for
		 * IPvFuture "v" followed by unreserved / sub-delims / ':'. */
		return chars_problem(s + 1, n - 2, ":", "host", why, whylen);
	}
	return chars_problem(s, n, "", "host", why, whylen);
}

/* authority = [ userinfo "@" ] host [ ":" port ] */
static const char *authority_problem(const char *s, size_t n, char *why,
				     size_t whylen)
{
	const char *at = memchr(s, '@', n);
	const char *host = s, *port = NULL;
	size_t hostlen;

	if (at) {
		if (chars_problem(s, (size_t)(at - s), ":", "userinfo", why,
				  whylen))
			return why;
		host = at + 1;
	}
	hostlen = n - (size_t)(host - s);
	/* The port follows the ':' after the host (after an IP literal's
	 * ']', since the literal holds ':' itself). */
	const char *close = memchr(host, ']', hostlen);
	if (hostlen > 0 && host[0] == '[' && !close) {
		snprintf(why, whylen, "an unclosed '[' in the host");
		return why;
	}
	const char *from = close ? close : host;
	const char *colon = memchr(from, ':', hostlen - (size_t)(from - host));
	if (colon) {
		port = colon + 1;
		hostlen = (size_t)(colon - host);
		for (const char *p = port; p < s + n; p++) {
			if (!isdigit((unsigned char)*p)) {
				snprintf(why, whylen,
					 "a port that is not a number");
				return why;
			}
		}
	}
	return host_problem(host, hostlen, why, whylen);
}

const char *cloudevent_uri_reference_problem(const char *s, char *why,
					     size_t whylen)
{
	size_t n = strlen(s);
	size_t hier_end = strcspn(s, "?#");
	size_t colon = strcspn(s, ":/?#");
	const char *p = s;

	/* scheme ":" when a ':' comes before any '/', '?' or '#': a relative
	 * reference cannot start with a segment holding ':' (path-noscheme),
	 * so that ':' must end a scheme. */
	if (s[colon] == ':') {
		if (colon == 0 || !is_alpha((unsigned char)s[0])) {
			snprintf(why, whylen, "an invalid scheme");
			return why;
		}
		for (size_t i = 1; i < colon; i++) {
			unsigned char c = (unsigned char)s[i];
			if (!is_alpha(c) && !isdigit(c) && c != '+' &&
			    c != '-' && c != '.') {
				snprintf(why, whylen, "an invalid scheme");
				return why;
			}
		}
		p = s + colon + 1;
	}
	if (p[0] == '/' && p[1] == '/') {
		size_t alen = strcspn(p + 2, "/?#");

		if (authority_problem(p + 2, alen, why, whylen))
			return why;
		p += 2 + alen;
	}
	/* path: segments of pchar separated by '/' */
	if (chars_problem(p, (size_t)(s + hier_end - p), ":@/", "path", why,
			  whylen))
		return why;
	p = s + hier_end;
	if (*p == '?') {
		size_t qlen = strcspn(p + 1, "#");

		if (chars_problem(p + 1, qlen, ":@/?", "query", why, whylen))
			return why;
		p += 1 + qlen;
	}
	if (*p == '#' && chars_problem(p + 1, n - (size_t)(p + 1 - s), ":@/?",
				       "fragment", why, whylen))
		return why;
	return NULL;
}

int cloudevent_source_check(const char *v, char *why, size_t whylen)
{
	char problem[96];

	if (*v == '\0' || strlen(v) > CLOUDEVENT_SOURCE_MAX) {
		snprintf(
		    why, whylen,
		    "must be a non-empty URI-reference of at most %d bytes",
		    CLOUDEVENT_SOURCE_MAX);
		return -1;
	}
	if (cloudevent_uri_reference_problem(v, problem, sizeof(problem))) {
		snprintf(why, whylen, "is not a URI-reference (RFC 3986): %s",
			 problem);
		return -1;
	}
	return 0;
}
