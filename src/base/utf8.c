/* SPDX-License-Identifier: MIT */
/*
 * UTF-8: decoding one sequence strictly, and copying text as valid UTF-8
 * (base.h).
 */
#include <string.h>

#include "base.h"

size_t utf8_decode(const unsigned char *s, size_t len, uint32_t *cp)
{
	unsigned char c = s[0];
	uint32_t v, min;
	size_t n;

	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	if (c >= 0xC2 && c <= 0xDF) {
		n = 2;
		v = c & 0x1Fu;
		min = 0x80;
	} else if ((c & 0xF0) == 0xE0) {
		n = 3;
		v = c & 0x0Fu;
		min = 0x800;
	} else if (c >= 0xF0 && c <= 0xF4) {
		n = 4;
		v = c & 0x07u;
		min = 0x10000;
	} else {
		return 0;
	}
	if (len < n)
		return 0;
	for (size_t i = 1; i < n; i++) {
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		v = (v << 6) | (s[i] & 0x3Fu);
	}
	if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
		return 0;
	*cp = v;
	return n;
}

void utf8_copy_valid(char *dst, size_t size, const char *src)
{
	const unsigned char *s = (const unsigned char *)src;
	size_t len = strlen(src), at = 0;
	for (size_t i = 0; i < len;) {
		uint32_t cp;
		size_t k = utf8_decode(s + i, len - i, &cp);
		size_t take = k ? k : 1;
		if (at + take >= size)
			break;
		if (k)
			memcpy(dst + at, s + i, k);
		else
			dst[at] = '?';
		at += take;
		i += take;
	}
	dst[at] = '\0';
}
