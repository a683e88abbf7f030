/* SPDX-License-Identifier: MIT */
/*
 * cJSON's allocations go through here so that a parse that failed because
 * memory ran out can be told from one that failed on bad input: cJSON
 * returns NULL for both, and a row's headers taken for bad JSON would be
 * failed for good (or its JSON payload sent as base64) where the row only
 * needs another try.
 */
#include "encode/encode.h"
#include "encode/encode_test.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#include <cJSON.h>

/* Per thread: a thread reads only what its own allocations did. */
static _Thread_local bool ran_out;

/* The test seam (encode_test.h): cJSON allocations to let through, then
 * to fail. Atomics, as any thread may allocate; both 0 outside tests. */
static atomic_int let_through, to_fail;

static bool seam_fails(void)
{
	if (atomic_load_explicit(&to_fail, memory_order_relaxed) <= 0 ||
	    atomic_fetch_sub(&let_through, 1) > 0)
		return false;
	return atomic_fetch_sub(&to_fail, 1) > 0;
}

void encode_test_json_fail(int after, int count)
{
	atomic_store(&to_fail, 0);
	atomic_store(&let_through, after);
	atomic_store(&to_fail, count);
}

static void *json_malloc(size_t n)
{
	void *p = seam_fails() ? NULL : malloc(n);
	if (!p)
		ran_out = true;
	return p;
}

/* Before main(), so before any thread calls cJSON: cJSON_InitHooks()
 * writes the hooks every cJSON call reads, without a lock. The linker
 * keeps this file in every binary that encodes, as cloudevent.c calls it
 * (encode_json_value_parses(), encode_json_memory_watch()). */
__attribute__((constructor)) static void json_memory_hooks(void)
{
	cJSON_Hooks hooks = {.malloc_fn = json_malloc, .free_fn = free};
	cJSON_InitHooks(&hooks);
}

void encode_json_memory_watch(void)
{
	ran_out = false;
}

bool encode_json_memory_ran_out(void)
{
	return ran_out;
}

int encode_json_value_parses(const unsigned char *p, size_t n)
{
	const char *end = NULL;
	ran_out = false;
	cJSON *doc = cJSON_ParseWithLengthOpts((const char *)p, n, &end, 0);
	if (!doc)
		return ran_out ? -1 : 0;
	/* Without require_null_terminated cJSON stops after the first value
	 * (with it, it wants a NUL inside the n bytes), so the rest is
	 * checked here: only the four JSON blanks may follow. */
	bool ok = true;
	for (; ok && end < (const char *)p + n; end++)
		ok =
		    *end == ' ' || *end == '\t' || *end == '\n' || *end == '\r';
	cJSON_Delete(doc);
	return ok ? 1 : 0;
}
