/* SPDX-License-Identifier: MIT */
/*
 * What `status` tells an on-call engineer, from fixed status objects: the
 * attention list and the lines of the text form.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ops/metrics_text.h"
#include "ops/status_text.h"
#include "base/base.h"

/* Everything wrong at once. */
static const char troubled[] =
    "{\"table\": \"\\\"app\\\".\\\"outbox_events\\\"\","
    " \"database\": {\"checked_at\": \"2024-05-01T12:00:00Z\","
    "  \"database\": \"shop\", \"server_version\": \"16.2\"},"
    " \"replicas\": ["
    "  {\"id\": \"pod-a/1\", \"version\": \"1.0\", \"protocol\": 1,"
    "   \"retention_ms\": 86400000, \"state\": \"alive\","
    "   \"alive\": true, \"up_seconds\": 7500, \"last_seen_seconds_ago\": 2},"
    "  {\"id\": \"pod-b/1\", \"version\": \"1.0\", \"state\": \"draining\","
    "   \"protocol\": 1, \"retention_ms\": 0,"
    "   \"alive\": true, \"up_seconds\": 90000, \"last_seen_seconds_ago\": 1},"
    "  {\"id\": \"pod-c/1\", \"version\": \"0.9\", \"protocol\": null,"
    "   \"state\": \"alive\","
    "   \"alive\": false, \"up_seconds\": 600, \"last_seen_seconds_ago\": 75}],"
    " \"backlog\": {\"pending\": 1200, \"due_now\": 1100, \"crash_suspects\": "
    "1,"
    "  \"oldest_pending_age_seconds\": 252.4,"
    "  \"oldest_pending_created_at\": \"2024-05-01T11:55:48Z\"},"
    " \"in_flight\": {\"count\": 3, \"expired_leases\": 1},"
    " \"in_flight_holders\": ["
    "  {\"holder\": \"pod-a/1\", \"holder_alive\": true, \"rows\": 1,"
    "   \"expired\": 0, \"next_expiry_in_seconds\": 42},"
    "  {\"holder\": \"pod-c/1\", \"holder_alive\": false, \"rows\": 2,"
    "   \"expired\": 1, \"next_expiry_in_seconds\": -5}],"
    " \"in_flight_rows\": ["
    "  {\"id\": \"01900000-0000-7000-8000-000000000001\", \"type\": "
    "\"order.paid\","
    "   \"leased_by\": \"pod-c/1/worker-0\", \"holder_alive\": false,"
    "   \"attempts\": 2, \"max_attempts\": 10, \"lease_expires_in_seconds\": "
    "-5}],"
    " \"failed\": {\"count\": 7},"
    " \"failed_by_type\": [{\"type\": \"order.created\", \"count\": 7,"
    "  \"last_failed_at\": \"2024-05-01T11:59:00Z\","
    "  \"sample_error\": \"NOT_FOUND - no exchange 'orders'\\nsecond line\"}],"
    " \"paused\": [{\"destination\": \"*\", \"paused_seconds\": 600,"
    "  \"paused_by\": \"alice@laptop\", \"reason\": \"broker upgrade\"},"
    "  {\"destination\": \"audit\", \"paused_seconds\": 60,"
    "   \"paused_by\": \"bob@host\", \"reason\": null}],"
    " \"blocked_keys\": {\"present\": true, \"count\": 1, \"rows\": [{\"key\":"
    "  {\"partition_key\": \"order-42\", \"blocking_id\": \"0190-x\","
    "   \"blocked_at\": \"2024-05-01T11:00:00Z\", \"reason\": \"too "
    "large\"}}]},"
    " \"table_stats\": {\"live_tuples\": 5000, \"dead_tuples\": 250000,"
    "  \"total_bytes\": 1572864, \"vacuumed_seconds_ago\": 4000,"
    "  \"last_vacuum\": null, \"last_autovacuum\": \"2024-05-01T10:53:00Z\"},"
    " \"oldest_xmin_holders\": [{\"kind\": \"session\", \"pid\": 4242,"
    "  \"name\": \"report-job\", \"user_name\": \"bi\","
    "  \"state\": \"idle in transaction\", \"xmin_age\": 99000,"
    "  \"xact_age_seconds\": 7300, \"query\": \"SELECT *\\n FROM orders\"},"
    "  {\"kind\": \"replication slot\", \"pid\": null, \"name\": \"old_cdc\","
    "   \"state\": \"inactive\", \"xmin_age\": 5000, \"xact_age_seconds\": "
    "null},"
    "  {\"kind\": \"replication slot\", \"pid\": null, \"name\": \"cdc\","
    "   \"state\": \"active\", \"xmin_age\": null, \"catalog_xmin_age\": "
    "70, \"xact_age_seconds\": null}]"
    "}";

/* Nothing wrong. */
static const char healthy[] =
    "{\"table\": \"\\\"outbox_events\\\"\","
    " \"database\": {\"checked_at\": \"2024-05-01T12:00:00Z\"},"
    " \"replicas\": [{\"id\": \"pod-a/1\", \"version\": \"1.0\","
    "  \"state\": \"alive\", \"alive\": true, \"up_seconds\": 30,"
    "  \"last_seen_seconds_ago\": 1}],"
    " \"backlog\": {\"pending\": 0, \"due_now\": 0, \"crash_suspects\": 0,"
    "  \"oldest_pending_age_seconds\": null},"
    " \"in_flight\": {\"count\": 0, \"expired_leases\": 0},"
    " \"in_flight_holders\": [], \"in_flight_rows\": [],"
    " \"failed\": {\"count\": 0}, \"failed_by_type\": [], \"paused\": [],"
    " \"blocked_keys\": {\"present\": true, \"count\": 0, \"rows\": []},"
    " \"table_stats\": {\"live_tuples\": 10, \"dead_tuples\": 0,"
    "  \"total_bytes\": 90112, \"vacuumed_seconds_ago\": null},"
    " \"oldest_xmin_holders\": []}";

/* Adds its attention list to st, renders it; returns the text. */
static char *render_object(cJSON *st)
{
	cJSON *att = status_attention(st);
	assert_non_null(att);
	assert_true(cJSON_AddItemToObject(st, "attention", att));
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	assert_non_null(f);
	status_print(st, f);
	assert_int_equal(fclose(f), 0);
	assert_non_null(text);
	return text;
}

/* Parses json and renders it; *st_out is the object. */
static char *render(const char *json, cJSON **st_out)
{
	cJSON *st = cJSON_Parse(json);
	assert_non_null(st);
	*st_out = st;
	return render_object(st);
}

static void has_line(const char *text, const char *line)
{
	const char *p = text;
	size_t n = strlen(line);
	while ((p = strstr(p, line)) != NULL) {
		if ((p == text || p[-1] == '\n') &&
		    (p[n] == '\n' || p[n] == '\0'))
			return;
		p++;
	}
	fail_msg("no line \"%s\" in:\n%s", line, text);
}

static void has_text(const char *text, const char *part)
{
	if (!text || !strstr(text, part))
		fail_msg("no \"%s\" in:\n%s", part, text ? text : "");
}

static bool attention_has(const cJSON *st, const char *part)
{
	const cJSON *a;
	cJSON_ArrayForEach(a, cJSON_GetObjectItemCaseSensitive(st, "attention"))
	{
		if (strstr(a->valuestring, part))
			return true;
	}
	return false;
}

static void test_troubled(void **state)
{
	(void)state;
	cJSON *st;
	char *text = render(troubled, &st);

	assert_true(attention_has(st, "1 replica silent for more than 15 s"));
	assert_true(attention_has(st, "2 in-flight rows held by replicas that "
				      "are not alive"));
	assert_true(attention_has(st, "1 expired lease not yet swept"));
	assert_true(attention_has(st, "7 failed rows"));
	assert_true(attention_has(st, "all leasing is PAUSED"));
	assert_true(attention_has(st, "1 destination paused by an operator"));
	assert_true(attention_has(st, "1 partition key blocked"));
	assert_true(attention_has(st, "session pid 4242 (report-job) has held "
				      "a snapshot for 2h01m"));
	/* The inactive slot holding xmin is named; the active one holding
	 * the catalogs only is not. */
	assert_true(attention_has(st, "replication slot 'old_cdc' is inactive "
				      "and holds the xmin horizon 5000 "
				      "transactions back"));
	assert_false(attention_has(st, "'cdc'"));
	assert_false(attention_has(st, "no live replica"));
	assert_int_equal(cJSON_GetArraySize(
			     cJSON_GetObjectItemCaseSensitive(st, "attention")),
			 9);

	has_text(text, "table \"app\".\"outbox_events\", database shop "
		       "(PostgreSQL 16.2), at 2024-05-01T12:00:00Z");
	has_line(text, "REPLICAS  2 alive, 1 dead");
	has_text(text, "  alive     pod-a/1 ");
	/* The protocol a relay speaks; none before the registry kept it.
	 * How long it keeps sent rows: none for no history, ? before the
	 * registry kept it. */
	has_text(text, "1.0        1        1d00h     2h05m");
	has_text(text, "1.0        1        none      1d01h");
	has_text(text, "0.9        none     ?         10m00s");
	has_text(text, "  draining  pod-b/1 ");
	has_text(text, "  DEAD      pod-c/1 ");
	has_text(text, "2h05m     2s ago");
	has_text(text, "1d01h     1s ago");
	has_line(text,
		 "  pending         1200 (due now 1100, crash suspects 1)");
	has_line(text,
		 "  oldest pending  4m12s (created 2024-05-01T11:55:48Z)");
	has_line(text, "IN FLIGHT  3 rows, 1 expired lease");
	has_text(text,
		 "pod-c/1                          NO     2       1        "
		 "EXPIRED 5s ago");
	has_text(text,
		 "order.paid               pod-c/1/worker-0                "
		 "   NO     2/10     EXPIRED 5s ago");
	has_line(text, "FAILED  7 rows");
	/* The sample error stays on one line. */
	has_text(text, "NOT_FOUND - no exchange 'orders' second line");

	has_line(text, "  ALL LEASING  for 10m00s, by alice@laptop: broker "
		       "upgrade");
	has_line(text, "  destination 'audit'  for 1m00s, by bob@host: (no "
		       "reason given)");
	has_line(text, "  key 'order-42' blocked by row 0190-x since "
		       "2024-05-01T11:00:00Z: too large");
	has_line(text, "  live tuples 5000, dead tuples 250000, size 1.5 MB "
		       "(with indexes)");
	has_text(text, "  vacuumed 1h06m ago (last vacuum never, last "
		       "autovacuum 2024-05-01T10:53:00Z)");
	has_line(text, "  pid 4242, report-job, user bi, idle in transaction, "
		       "transaction open 2h01m, xmin age 99000");
	has_line(text, "      query: SELECT *  FROM orders");
	has_line(text, "  replication slot old_cdc (inactive), xmin age 5000");
	has_line(text, "  replication slot cdc (active), xmin age 0, catalog "
		       "xmin age 70 (catalogs only)");
	free(text);
	cJSON_Delete(st);
}

static void test_healthy(void **state)
{
	(void)state;
	cJSON *st;
	char *text = render(healthy, &st);
	assert_int_equal(cJSON_GetArraySize(
			     cJSON_GetObjectItemCaseSensitive(st, "attention")),
			 0);
	has_line(text, "all clear: nothing needs attention");
	has_line(text, "REPLICAS  1 alive, 0 dead");
	has_line(text, "  oldest pending  -");
	has_line(text, "IN FLIGHT  0 rows, 0 expired leases");
	has_line(text, "FAILED  0 rows");
	has_line(text, "  vacuumed: never since statistics were reset");
	assert_null(strstr(text, "ATTENTION"));
	free(text);
	cJSON_Delete(st);

	/* No replica at all is the first thing to say. */
	cJSON *none = cJSON_Parse(healthy);
	assert_non_null(none);
	cJSON_ReplaceItemInObject(none, "replicas", cJSON_CreateArray());
	cJSON *att = status_attention(none);
	assert_int_equal(cJSON_GetArraySize(att), 1);
	assert_non_null(
	    strstr(cJSON_GetArrayItem(att, 0)->valuestring, "no live replica"));
	cJSON_Delete(att);
	cJSON_Delete(none);
}

/* Long text is cut on a UTF-8 character boundary and marked. */
static void test_long_text(void **state)
{
	(void)state;
	char query[256] = "";
	for (int i = 0; i < 100; i++)
		strcat(query, "\xc3\xa9"); /* e acute: two bytes */
	cJSON *st = cJSON_Parse(healthy);
	assert_non_null(st);
	cJSON *holders = cJSON_CreateArray();
	cJSON *h = cJSON_CreateObject();
	cJSON_AddStringToObject(h, "kind", "session");
	cJSON_AddNumberToObject(h, "pid", 7);
	cJSON_AddStringToObject(h, "name", "app");
	cJSON_AddStringToObject(h, "query", query);
	cJSON_AddItemToArray(holders, h);
	cJSON_ReplaceItemInObject(st, "oldest_xmin_holders", holders);
	char *text = render_object(st);
	const char *line = strstr(text, "      query: ");
	assert_non_null(line);
	line += strlen("      query: ");
	size_t len = strcspn(line, "\n");
	/* 150 bytes at most: 73 whole characters, then "...". */
	assert_int_equal(len, 146 + 3);
	assert_memory_equal(line + 146, "...", 3);
	assert_memory_equal(line, query, 146);
	free(text);
	cJSON_Delete(st);
}

/* The gauge query paces itself: a slow count (a big backlog) waits
 * GAUGE_COST_FACTOR times its own length, a fast one the base interval. */
static void test_gauge_pacing(void **state)
{
	(void)state;
	assert_int_equal(metrics_gauge_pause_ms(5000, 3), 5000);
	assert_int_equal(metrics_gauge_pause_ms(5000, 0), 5000);
	assert_int_equal(metrics_gauge_pause_ms(5000, 300), 30000);
	assert_int_equal(metrics_gauge_pause_ms(5000, 1500),
			 1500 * GAUGE_COST_FACTOR);
}

/* What a lease steps over: entries returned without a visible row, per
 * scan of the pending index, between two readings of its counters. */
static void test_dead_entries_per_scan(void **state)
{
	(void)state;
	const int64_t t0[3] = {100, 5000, 4000}, none[3] = {0, 0, 0};
	/* 10 scans read 2,000 entries and fetched 500 live rows. */
	assert_int_equal(metrics_dead_entries_per_scan_milli(
			     t0, (const int64_t[3]){110, 7000, 4500}, none),
			 150000);
	/* Every entry had a live row: nothing stepped over. */
	assert_int_equal(metrics_dead_entries_per_scan_milli(
			     t0, (const int64_t[3]){103, 5010, 4010}, none),
			 0);
	/* No scan ran. */
	assert_int_equal(metrics_dead_entries_per_scan_milli(
			     t0, (const int64_t[3]){100, 5000, 4000}, none),
			 0);
	/* A statistics reset: the interval tells nothing. */
	assert_int_equal(metrics_dead_entries_per_scan_milli(
			     t0, (const int64_t[3]){2, 9, 9}, none),
			 -1);
	/* The gauges' own backlog count, a bitmap scan that returned 600
	 * entries and fetched none, is not the lease's: 10 lease scans
	 * passed 100 dead entries. */
	assert_int_equal(metrics_dead_entries_per_scan_milli(
			     t0, (const int64_t[3]){111, 6100, 4400},
			     (const int64_t[3]){1, 600, 0}),
			 10000);
	/* Own counts not yet flushed into the cumulative ones (the deltas
	 * are smaller than them) are not subtracted. */
	assert_int_equal(metrics_dead_entries_per_scan_milli(
			     t0, (const int64_t[3]){110, 5100, 4000},
			     (const int64_t[3]){1, 600, 0}),
			 10000);
}

/* The holder of the xmin horizon is one series whose labels are the
 * text the database gave, escaped for the exposition format. */
static void test_horizon_holder_info(void **state)
{
	(void)state;
	metrics_set(MG_XMIN_HORIZON_AGE_MS, 125500);
	metrics_set(MG_XMIN_AGE_SLOTS, 42);
	metrics_set(MG_LEASE_DEAD_ENTRIES_MILLI, 2500);
	metrics_publish_horizon_holder("session", "pg_dump \"nightly\"\n", 4242,
				       125500, "");
	char *text = NULL;
	size_t len = 0;
	FILE *out = open_memstream(&text, &len);
	assert_non_null(out);
	metrics_text_render(out);
	fclose(out);
	has_line(text, "outbox_xmin_horizon_holder_info{kind=\"session\","
		       "name=\"pg_dump \\\"nightly\\\"\\n\",pid=\"4242\"} 1");
	has_line(text, "outbox_xmin_horizon_age_seconds 125.500000");
	has_line(text, "outbox_xmin_age_transactions{holder=\"replication_"
		       "slot\"} 42");
	has_line(text, "outbox_lease_dead_index_entries_per_scan 2.500000");
	/* One header for the three kinds. */
	assert_null(
	    strstr(strstr(text, "# TYPE outbox_xmin_age_transactions") + 1,
		   "# TYPE outbox_xmin_age_transactions"));
	free(text);

	/* A short holder (the relay's own lease, say) is shown by kind
	 * alone; a session of unknown age, a slot, a prepared transaction
	 * by name; nothing at all as none. */
	const struct {
		const char *kind, *name;
		int64_t pid, age_ms;
		const char *database, *line;
	} cases[] = {
	    {"session", "outbox-relay", 77, HORIZON_NAMED_AFTER_MS - 1, "",
	     "{kind=\"session\",name=\"\",pid=\"\"} 1"},
	    {"session", "outbox-relay", 77, HORIZON_NAMED_AFTER_MS, "",
	     "{kind=\"session\",name=\"outbox-relay\",pid=\"77\"} 1"},
	    {"session", "report", 78, 0, "",
	     "{kind=\"session\",name=\"report\",pid=\"78\"} 1"},
	    {"replication_slot", "standby_1", 0, 0, "",
	     "{kind=\"replication_slot\",name=\"standby_1\",pid=\"\"} 1"},
	    {"prepared_transaction", "tx-9", 0, 5, "",
	     "{kind=\"prepared_transaction\",name=\"tx-9\",pid=\"\"} 1"},
	    {"", "", 0, 0, "", "{kind=\"none\",name=\"\",pid=\"\"} 1"},
	    /* With several databases, the one it holds. */
	    {"session", "pg_dump", 79, 0, "shard2",
	     "{kind=\"session\",name=\"pg_dump\",pid=\"79\",database="
	     "\"shard2\"} 1"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		metrics_publish_horizon_holder(cases[i].kind, cases[i].name,
					       cases[i].pid, cases[i].age_ms,
					       cases[i].database);
		out = open_memstream(&text, &len);
		assert_non_null(out);
		metrics_text_render(out);
		fclose(out);
		char want[200];
		snprintf(want, sizeof(want),
			 "outbox_xmin_horizon_holder_info%s", cases[i].line);
		has_line(text, want);
		free(text);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_troubled),
	    cmocka_unit_test(test_healthy),
	    cmocka_unit_test(test_long_text),
	    cmocka_unit_test(test_gauge_pacing),
	    cmocka_unit_test(test_dead_entries_per_scan),
	    cmocka_unit_test(test_horizon_holder_info),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
