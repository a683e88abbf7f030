/* SPDX-License-Identifier: MIT */
/*
 * The status object of store_admin_status() turned into what an on-call
 * engineer reads first: a list of what needs attention, and the text form
 * of `outbox-relay status`. Pure functions of the object: no I/O besides
 * the given stream, no database.
 */
#ifndef OUTBOX_STATUS_TEXT_H
#define OUTBOX_STATUS_TEXT_H

#include <stdio.h>

#include <cjson/cJSON.h>

/* Returns a new array of strings (dead replicas, orphaned or expired
 * leases, failed rows, pauses, blocked keys, old snapshots, no live
 * replica), empty when all is well; NULL when out of memory. */
cJSON *status_attention(const cJSON *st);

/* Writes the text form of st, including its "attention" member, to out. */
void status_print(const cJSON *st, FILE *out);

#endif
