/* SPDX-License-Identifier: MIT */
/*
 * A leased row to CloudEvents, through every encoder: the check, binary
 * headers, the structured envelope, and the AMQP and Kafka mappings in
 * both content modes. The input is the row's text columns separated by
 * NUL bytes (a field starting with 0xff is NULL) followed by the payload:
 *   mode id type source subject content_type exchange routing_key
 *   partition_key headers time \0 payload
 * mode's first byte picks the backend, content mode and header prefix.
 * Oracle: every encoder refuses exactly what cloudevent_validate()
 * refuses; a structured envelope is JSON.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "encode/encode.h"
#include "fuzz_common.h"
#include "publishers/amqp_map.h"
#include "publishers/kafka.h"
#include "publishers/publisher.h"

/* amqp binary "ce-", amqp binary "cloudEvents_", amqp structured, kafka
 * binary, kafka structured */
static struct config cfgs[5];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void load(struct config *cfg, const char *publisher, const char *mode,
		 const char *prefix)
{
	struct config_extensions ext;
	FILE *devnull = fopen("/dev/null", "w");

	publisher_config_extensions(&ext);
	setenv("OUTBOX_PUBLISHER", publisher, 1);
	setenv("OUTBOX_CE_MODE", mode, 1);
	setenv("OUTBOX_AMQP_HEADER_PREFIX", prefix, 1);
	if (!devnull || config_load(cfg, &ext, devnull) != 0)
		abort();
	fclose(devnull);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	load(&cfgs[0], "amqp", "binary", "ce-");
	load(&cfgs[1], "amqp", "binary", "cloudEvents_");
	load(&cfgs[2], "amqp", "structured", "ce-");
	load(&cfgs[3], "kafka", "binary", "ce-");
	load(&cfgs[4], "kafka", "structured", "ce-");
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_fields f;
	struct outbox_event ev;
	struct ce_headers h = {0};
	char reason[512], reason2[512];
	size_t len = 0;
	int valid;

	fuzz_split(data, size, 11, &f);
	ev = (struct outbox_event){
	    .id = f.field[1],
	    .seq = 1,
	    .type = f.field[2],
	    .source = f.field[3][0] ? f.field[3] : "/fuzz",
	    .subject = fuzz_nullable(f.field[4]),
	    .content_type = fuzz_nullable(f.field[5]),
	    .exchange = fuzz_nullable(f.field[6]),
	    .routing_key = f.field[7],
	    .partition_key = fuzz_nullable(f.field[8]),
	    .payload = f.rest,
	    .payload_len = f.rest_len,
	    .headers_json = fuzz_nullable(f.field[9]),
	    .time = f.field[10],
	    .created_at_us = 1714566896789000,
	    .attempts = 1,
	    .max_attempts = 10,
	};
	valid = cloudevent_validate(&ev, reason, sizeof(reason)) == 0;

	if ((cloudevent_binary_headers(&ev, "ce_", &h, reason2,
				       sizeof(reason2)) == 0) != valid)
		abort();
	ce_headers_release(&h);
	char *env = cloudevent_structured(&ev, &len, reason2, sizeof(reason2));
	if ((env != NULL) != valid)
		abort();
	if (env) {
		cJSON *j = cJSON_ParseWithLength(env, len);
		if (!j)
			abort(); /* the envelope is not JSON */
		cJSON_Delete(j);
		free(env);
	}

	unsigned mode = (unsigned char)f.field[0][0] % 5;
	if (mode < 3) {
		struct rmq_msg m;
		if (rmq_msg_build(&cfgs[mode], &ev, &m, reason2,
				  sizeof(reason2)) == 0) {
			if (!valid)
				abort();
			rmq_msg_header_frame_size(&m);
			rmq_msg_check_fit(&m, 131072, reason2, sizeof(reason2));
		}
		rmq_msg_release(&m);
	} else {
		struct kafka_msg m;
		enum pub_outcome fail;
		if (kafka_msg_build(&cfgs[mode], &ev, &m, &fail, reason2,
				    sizeof(reason2)) == 0) {
			if (!valid)
				abort();
			kafka_msg_release(&m);
		}
	}
	fuzz_fields_free(&f);
	return 0;
}
