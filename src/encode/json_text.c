/* SPDX-License-Identifier: MIT */
/*
 * JSON text the relay embeds or parses, held to RFC 8259 where cJSON 1.7
 * is looser (docs/design.md §10): a JSON payload copied into a
 * structured event's data, and the \u escapes of a row's headers.
 */
#include "encode/encode.h"

#include <ctype.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Whether p, just past a backslash and a 'u', holds four hex digits. */
static bool four_hex(const unsigned char *p, size_t left)
{
	if (left < 4)
		return false;
	for (int i = 0; i < 4; i++)
		if (!isxdigit(p[i]))
			return false;
	return true;
}

/*
 * What is wrong with JSON text s's \u escapes, or NULL. cJSON decodes
 * \u0000 into a NUL that ends the name or value early (jsonb refuses it,
 * but a json or text column of a table made by hand keeps it), and a \u
 * without four hex digits likewise, where it should refuse the text.
 */
const char *encode_json_u_escape_problem(const char *s)
{
	for (const char *p = s; (p = strchr(p, '\\'));) {
		if (p[1] == 'u') {
			if (!four_hex((const unsigned char *)p + 2,
				      strnlen(p + 2, 4)))
				return "headers are not valid json (\\u not "
				       "followed by four hex digits)";
			if (strncmp(p + 2, "0000", 4) == 0)
				return "headers contain a NUL character "
				       "(\\u0000)";
		}
		p += p[1] ? 2 : 1;
	}
	return NULL;
}

/* True when the JSON digit about to be written at dst[o] starts the
 * integer part of a number (so a '0' there must stand alone). */
static bool starts_integer(const char *dst, size_t o)
{
	char p;

	if (o == 0)
		return true;
	p = dst[o - 1];
	if (p == '-')
		return o < 2 || (dst[o - 2] != 'e' && dst[o - 2] != 'E');
	return !(isdigit((unsigned char)p) || p == '.' || p == 'e' ||
		 p == 'E' || p == '+');
}

/*
 * Copies the JSON text src[0..n) to dst (room for n bytes) without the
 * whitespace between tokens, and refuses what cJSON 1.7 accepts but
 * RFC 8259 does not, so that what we embed is strict JSON: invalid UTF-8,
 * a byte-order mark, control characters (raw inside strings, or anything
 * but the four JSON blanks outside them), escapes other than RFC 8259's
 * (cJSON reads "\\u" without four hex digits as "\\u0000"), and the
 * number forms "01", "1." and "-.5". The structure is checked by cJSON
 * (encode_json_value_parses()); this only has to be right for text cJSON
 * accepts. cJSON_Minify() is not used:
 * it takes the quote after an escaped backslash ("a\\") as escaped too and
 * then strips the spaces inside the strings that follow.
 *
 * Returns the length written, or SIZE_MAX when src is not strict JSON.
 */
size_t encode_json_compact(const unsigned char *src, size_t n, char *dst)
{
	bool in_string = false;
	size_t i = 0, o = 0;

	while (i < n) {
		unsigned char c = src[i];

		if (c >= 0x80) {
			uint32_t cp;
			size_t k = utf8_decode(src + i, n - i, &cp);

			/* Outside strings JSON is ASCII (this also refuses
			 * a byte-order mark). */
			if (k == 0 || !in_string)
				return SIZE_MAX;
			memcpy(dst + o, src + i, k);
			o += k;
			i += k;
			continue;
		}
		if (in_string) {
			if (c < 0x20)
				return SIZE_MAX;
			dst[o++] = (char)c;
			i++;
			if (c == '"') {
				in_string = false;
			} else if (c == '\\') {
				/* Copying the escaped byte here keeps \"
				 * inside. cJSON reads a \u without four hex
				 * digits as \u0000 and lets it through. */
				if (i >= n || !src[i] ||
				    !strchr("\"\\/bfnrtu", src[i]))
					return SIZE_MAX;
				if (src[i] == 'u' &&
				    !four_hex(src + i + 1, n - i - 1))
					return SIZE_MAX;
				dst[o++] = (char)src[i++];
			}
			continue;
		}
		switch (c) {
		case ' ':
		case '\t':
		case '\n':
		case '\r':
			i++;
			continue;
		case '"':
			in_string = true;
			break;
		case '.':
			if (o == 0 || !isdigit((unsigned char)dst[o - 1]) ||
			    i + 1 >= n || !isdigit(src[i + 1]))
				return SIZE_MAX;
			break;
		case '0':
			if (starts_integer(dst, o) && i + 1 < n &&
			    isdigit(src[i + 1]))
				return SIZE_MAX;
			break;
		default:
			if (c < 0x20 || c == 0x7F)
				return SIZE_MAX;
			break;
		}
		dst[o++] = (char)c;
		i++;
	}
	return in_string ? SIZE_MAX : o;
}
