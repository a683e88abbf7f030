/* SPDX-License-Identifier: MIT */
/*
 * Advisory lock namespaces (the first int of the two-int form); the second
 * int is hashtext() of the table's literal name, so relays of different
 * outbox tables never contend.
 */
#ifndef OUTBOX_LOCKS_H
#define OUTBOX_LOCKS_H

#define LOCK_NS_MIGRATE 0x6f620001
#define LOCK_NS_SWEEP 0x6f620002
#define LOCK_NS_CLEAN 0x6f620003

#endif
