/* SPDX-License-Identifier: MIT */
#include "capture.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

#include <cmocka.h>

char *capture_stderr(void (*fn)(void *), void *arg)
{
	char path[] = "/tmp/outbox-stderr-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	unlink(path);
	fflush(stderr);
	int saved = dup(2);
	assert_true(saved >= 0);
	assert_int_equal(dup2(fd, 2), 2);
	fn(arg);
	fflush(stderr);
	assert_int_equal(dup2(saved, 2), 2);
	close(saved);
	off_t size = lseek(fd, 0, SEEK_END);
	assert_true(size >= 0);
	char *buf = calloc(1, (size_t)size + 1);
	assert_non_null(buf);
	assert_int_equal(pread(fd, buf, (size_t)size, 0), (ssize_t)size);
	close(fd);
	return buf;
}
