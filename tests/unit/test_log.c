/* SPDX-License-Identifier: MIT */
/* Log lines: JSON objects or text, levels, the thread name, escaping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>
#include <cmocka.h>

#include "base/base.h"

static char *capture(void (*emit)(void))
{
	char path[] = "/tmp/outbox-log-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	fflush(stderr);
	int saved = dup(2);
	dup2(fd, 2);
	emit();
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	lseek(fd, 0, SEEK_SET);
	char *buf = calloc(1, 8192);
	ssize_t n = read(fd, buf, 8191);
	assert_true(n >= 0);
	close(fd);
	unlink(path);
	return buf;
}

static void emit_json(void)
{
	log_setup(LOG_INFO, true);
	log_set_thread("worker-2");
	log_debug("hidden %d", 1);
	log_fields(LOG_WARN, "lost lease", "id", "a\"b\nc", NULL);
	log_info("plain %d", 42);
}

static void test_json_lines(void **state)
{
	(void)state;
	char *out = capture(emit_json);
	char *nl = strchr(out, '\n');
	assert_non_null(nl);
	*nl = '\0';
	cJSON *line = cJSON_Parse(out);
	assert_non_null(line);
	assert_string_equal(cJSON_GetObjectItem(line, "level")->valuestring,
			    "warn");
	assert_string_equal(cJSON_GetObjectItem(line, "msg")->valuestring,
			    "lost lease");
	assert_string_equal(cJSON_GetObjectItem(line, "thread")->valuestring,
			    "worker-2");
	assert_string_equal(cJSON_GetObjectItem(line, "id")->valuestring,
			    "a\"b\nc");
	assert_non_null(cJSON_GetObjectItem(line, "ts"));
	cJSON_Delete(line);
	cJSON *second = cJSON_Parse(nl + 1);
	assert_non_null(second);
	assert_string_equal(cJSON_GetObjectItem(second, "msg")->valuestring,
			    "plain 42");
	cJSON_Delete(second);
	assert_null(strstr(nl + 1, "hidden"));
	free(out);
}

static void emit_text(void)
{
	log_setup(LOG_DEBUG, false);
	log_set_thread("sweeper");
	log_debug("shown %d", 7);
}

static void test_text_lines(void **state)
{
	(void)state;
	char *out = capture(emit_text);
	assert_non_null(strstr(out, " debug shown 7 thread=sweeper\n"));
	free(out);
}

static void emit_text_hostile(void)
{
	log_setup(LOG_INFO, false);
	log_set_thread("worker-1");
	log_fields(LOG_WARN, "destination paused", "exchange",
		   "orders\n2024-01-01T00:00:00.000Z error forged\r\t\x1b[2K"
		   "\x7f\\n",
		   NULL);
	log_info("msg\nwith a newline");
}

/* Text lines escape control characters: no value can start a line of its
 * own or rewrite one on a terminal. */
static void test_text_escapes_controls(void **state)
{
	(void)state;
	char *out = capture(emit_text_hostile);
	assert_non_null(strstr(out, " warn destination paused thread=worker-1 "
				    "exchange=orders\\n2024-01-01T00:00:00"
				    ".000Z error forged\\r\\t\\x1b[2K"
				    "\\x7f\\n\n"));
	assert_non_null(strstr(out, " info msg\\nwith a newline "
				    "thread=worker-1\n"));
	/* Two log lines, so exactly two newlines. */
	size_t lines = 0;
	for (const char *p = out; *p; p++)
		lines += *p == '\n';
	assert_int_equal(lines, 2);
	assert_null(strchr(out, '\r'));
	assert_null(strchr(out, '\x1b'));
	assert_null(strchr(out, '\x7f'));
	free(out);
}

/* A JSON line longer than the line's buffer: cut short, but still one
 * valid JSON object of valid UTF-8 (an escape or a character is never
 * split, the string and the object closed), the cut value a prefix of the
 * value, the fields after it left out. Each shift moves the cut across a
 * different byte of the value's three-piece pattern. */
static int shift;

static void emit_long_json(void)
{
	char value[16000];
	size_t n = 0;
	for (int i = 0; i < shift; i++)
		value[n++] = 'a';
	while (n + 5 < sizeof(value)) {
		memcpy(value + n, "\"\xc3\xa9\x01", 4);
		n += 4;
	}
	value[n] = '\0';
	log_setup(LOG_INFO, true);
	log_set_thread("worker-1");
	log_fields(LOG_ERROR, "store failed", "error", value, "table", "t1",
		   NULL);
	log_info("after");
}

static void test_long_json_line_cut_valid(void **state)
{
	(void)state;
	for (shift = 0; shift < 8; shift++) {
		char *out = capture(emit_long_json);
		char *nl = strchr(out, '\n');
		assert_non_null(nl);
		assert_true(nl - out < 4096);
		*nl = '\0';
		cJSON *line = cJSON_Parse(out);
		if (!line)
			fail_msg("shift %d: not JSON: ...%s", shift,
				 nl - 40 > out ? nl - 40 : out);
		const char *cut =
		    cJSON_GetObjectItem(line, "error")->valuestring;
		assert_true(strlen(cut) > 1000);
		for (size_t i = 0; i < (size_t)shift; i++)
			assert_int_equal(cut[i], 'a');
		for (size_t i = (size_t)shift; cut[i]; i++)
			assert_int_equal(
			    cut[i], "\"\xc3\xa9\x01"[(i - (size_t)shift) % 4]);
		assert_null(cJSON_GetObjectItem(line, "table"));
		cJSON_Delete(line);
		cJSON *next = cJSON_Parse(nl + 1);
		assert_non_null(next);
		cJSON_Delete(next);
		free(out);
	}
}

static void test_level_parse(void **state)
{
	(void)state;
	assert_int_equal(log_level_parse("debug"), LOG_DEBUG);
	assert_int_equal(log_level_parse("error"), LOG_ERROR);
	assert_int_equal(log_level_parse("loud"), -1);
}

/* Text bound for a Prometheus label is copied as valid UTF-8: an
 * invalid sequence's bytes become '?', a copy too long for its buffer is
 * cut before the character that does not fit. */
static void test_utf8_copy_valid(void **state)
{
	(void)state;
	char out[16];
	utf8_copy_valid(out, sizeof(out), "rapport-\xc3\xa9t\xc3\xa9");
	assert_string_equal(out, "rapport-\xc3\xa9t\xc3\xa9");
	/* LATIN1's é, an overlong '/', a surrogate, a lone continuation. */
	utf8_copy_valid(out, sizeof(out), "\xe9t\xe9");
	assert_string_equal(out, "?t?");
	utf8_copy_valid(out, sizeof(out),
			"a\xc0\xaf\xed\xa0\x80\x80"
			"b");
	assert_string_equal(out, "a??????b");
	char small[5];
	utf8_copy_valid(small, sizeof(small), "a\xc3\xa9\xe2\x82\xac");
	assert_string_equal(small, "a\xc3\xa9");
	utf8_copy_valid(small, 1, "abc");
	assert_string_equal(small, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_json_lines),
	    cmocka_unit_test(test_text_lines),
	    cmocka_unit_test(test_text_escapes_controls),
	    cmocka_unit_test(test_long_json_line_cut_valid),
	    cmocka_unit_test(test_level_parse),
	    cmocka_unit_test(test_utf8_copy_valid),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
