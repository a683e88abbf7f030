/* SPDX-License-Identifier: MIT */
/* What a piece of code writes to stderr, where the relay's log goes. */
#ifndef OUTBOX_CAPTURE_H
#define OUTBOX_CAPTURE_H

/* Runs fn(arg) with stderr sent to a temporary file and returns what was
 * written, as a malloc'd string; fails the test on any I/O error. */
char *capture_stderr(void (*fn)(void *), void *arg);

#endif
