/* SPDX-License-Identifier: MIT */
/*
 * RFC 2046 media type syntax, for the CloudEvents `datacontenttype`
 * attribute (a row's content_type), which CloudEvents 1.0 requires to be
 * one, and the one media type a row may not give its data.
 */
#include "encode/encode.h"

#include <stdbool.h>
#include <string.h>
#include <strings.h>

/* A character of an RFC 2045 token: printable ASCII but the space and
 * the tspecials. */
static bool is_token_char(char c)
{
	return c > 0x20 && c < 0x7f && !strchr("()<>@,;:\\\"/[]?=", c);
}

const char *cloudevent_media_type_problem(const char *s)
{
	static const char not_one[] =
	    "is not a media type (type/subtype, RFC 2046)";
	const char *p = s;
	while (is_token_char(*p))
		p++;
	if (p == s || *p != '/')
		return not_one;
	const char *subtype = ++p;
	while (is_token_char(*p))
		p++;
	if (p == subtype)
		return not_one;
	p += strspn(p, " \t");
	if (*p != '\0' && *p != ';')
		return not_one;
	/* The CloudEvents bindings read a message of this content type as
	 * a whole event in structured mode, ignoring the binary mode's
	 * attribute headers. */
	if (strncasecmp(s, "application/cloudevents", 23) == 0)
		return "is application/cloudevents, which a consumer reads as "
		       "a whole event (structured mode): give the payload's "
		       "own type";
	return NULL;
}
