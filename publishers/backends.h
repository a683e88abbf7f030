/* SPDX-License-Identifier: MIT */
/*
 * The backends compiled in, one const struct publisher_ops each, defined
 * in publishers/<name>.c and listed in publisher_registry[] (registry.c).
 */
#ifndef OUTBOX_BACKENDS_H
#define OUTBOX_BACKENDS_H

#include "publisher.h"

/* One structured CloudEvent JSON per line on stdout (development, demos). */
extern const struct publisher_ops publisher_stdout;

#endif
