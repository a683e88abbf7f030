/* SPDX-License-Identifier: MIT */
/*
 * Helpers of the libFuzzer targets (tests/fuzz/README in docs/security.md):
 * cutting one input into NUL-terminated fields, each in an exact-size
 * heap block so ASan sees any read past its end.
 */
#ifndef OUTBOX_FUZZ_COMMON_H
#define OUTBOX_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_FIELDS_MAX 16

struct fuzz_fields {
	char *field[FUZZ_FIELDS_MAX]; /* NUL-terminated, owned */
	size_t n;
	unsigned char *rest; /* bytes after the last separator, owned */
	size_t rest_len;
};

/* Splits data at each '\0' into at most want fields; what follows the
 * want-th separator is rest (binary, not terminated). Missing fields are
 * empty strings. */
static inline void fuzz_split(const uint8_t *data, size_t size, size_t want,
			      struct fuzz_fields *f)
{
	size_t at = 0;

	memset(f, 0, sizeof(*f));
	if (want > FUZZ_FIELDS_MAX)
		want = FUZZ_FIELDS_MAX;
	for (f->n = 0; f->n < want; f->n++) {
		const uint8_t *nul =
		    at < size ? memchr(data + at, 0, size - at) : NULL;
		size_t len = nul ? (size_t)(nul - (data + at))
				 : (at < size ? size - at : 0);
		char *s = malloc(len + 1);

		if (!s)
			abort();
		if (len)
			memcpy(s, data + at, len);
		s[len] = '\0';
		f->field[f->n] = s;
		at += len + (nul ? 1 : 0);
	}
	f->rest_len = at < size ? size - at : 0;
	f->rest = malloc(f->rest_len ? f->rest_len : 1);
	if (!f->rest)
		abort();
	if (f->rest_len)
		memcpy(f->rest, data + at, f->rest_len);
}

static inline void fuzz_fields_free(struct fuzz_fields *f)
{
	for (size_t i = 0; i < f->n; i++)
		free(f->field[i]);
	free(f->rest);
	memset(f, 0, sizeof(*f));
}

/* A field starting with 0xff stands for NULL. */
static inline const char *fuzz_nullable(const char *s)
{
	return (unsigned char)s[0] == 0xff ? NULL : s;
}

#endif
