/* SPDX-License-Identifier: MIT */
/*
 * The names the store's statements are prepared under (run.c): on its
 * session, or pooled, on a server connection, where a store of another
 * relay may have prepared one. Either way the name says the text (FNV-1a,
 * 64 bits), so a name found there is this text, and two texts never
 * share one: a relay left at OUTBOX_PG_PREPARE=on behind a
 * transaction-mode pooler, before it hears that from a missing or a
 * taken name, ran under its own name another relay's text left on the
 * server connection (another table's lease, another version's mark).
 * A store's tag keeps two stores of a session apart.
 */
#include <inttypes.h>
#include <stdio.h>

#include "store_internal.h"

uint64_t store_text_hash(const char *sql)
{
	uint64_t h = UINT64_C(14695981039346656037);
	for (const unsigned char *p = (const unsigned char *)sql; *p; p++)
		h = (h ^ *p) * UINT64_C(1099511628211);
	return h;
}

struct stmt_name store_stmt_name(const char *tag, const char *what,
				 uint64_t hash)
{
	struct stmt_name n;
	if (!tag)
		snprintf(n.text, sizeof(n.text), "%s%016" PRIx64,
			 STORE_POOLED_PREFIX, hash);
	else
		snprintf(n.text, sizeof(n.text), "%s%s_%016" PRIx64, tag, what,
			 hash);
	return n;
}
