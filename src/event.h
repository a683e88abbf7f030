/* SPDX-License-Identifier: MIT */
/*
 * One leased outbox row as the publishers see it.
 *
 * Ownership: every pointer points into the lease batch that produced the
 * event (store.h, struct lease_batch) and lives exactly as long as it.
 * Publishers must copy what they keep past publish().
 */
#ifndef OUTBOX_EVENT_H
#define OUTBOX_EVENT_H

#include <stddef.h>
#include <stdint.h>

struct outbox_event {
	const char *id;		   /* uuid text; CloudEvents id */
	int64_t seq;		   /* insertion order */
	const char *type;	   /* CloudEvents type (may be "" on tables
				      without the CHECKs: must fail encode) */
	const char *source;	   /* pinned at lease, never NULL */
	const char *subject;	   /* NULL when absent */
	const char *content_type;  /* datacontenttype */
	const char *exchange;	   /* NULL: the backend's default destination */
	const char *routing_key;   /* never NULL, may be "" */
	const char *partition_key; /* NULL when absent */
	const unsigned char *payload;
	size_t payload_len;
	const char *headers_json; /* the headers column as JSON text */
	const char *time;	  /* created_at, RFC 3339 UTC */
	int64_t created_at_us;	  /* created_at, microseconds since epoch */
	int attempts;		  /* including this lease's charge */
	int max_attempts;
};

#endif
