/* SPDX-License-Identifier: MIT */
/*
 * Test hook of the encoder, for tests and the test-only publisher: memory
 * running out inside cJSON. Nothing in the relay includes this.
 */
#ifndef OUTBOX_ENCODE_TEST_H
#define OUTBOX_ENCODE_TEST_H

/* From now, cJSON's next `after` allocations (any thread's) succeed and
 * the `count` after them fail, as when memory ran out; (0, 0) ends it. */
void encode_test_json_fail(int after, int count);

#endif
