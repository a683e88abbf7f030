/* SPDX-License-Identifier: MIT */
/*
 * The headers column check: the input is the headers JSON text of an
 * otherwise valid row. Oracle: the binary encoder accepts exactly what
 * cloudevent_validate() accepts, and then carries every row header.
 */
#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "encode/encode.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_fields f;
	struct ce_headers h = {0};
	char reason[512];
	static const unsigned char payload[] = "{}";

	fuzz_split(data, size, 1, &f);
	struct outbox_event ev = {
	    .id = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b",
	    .type = "t",
	    .source = "/fuzz",
	    .content_type = "application/json",
	    .routing_key = "",
	    .payload = payload,
	    .payload_len = 2,
	    .headers_json = f.field[0],
	    .time = "2024-05-01T12:34:56.789000Z",
	};
	int valid = cloudevent_validate(&ev, reason, sizeof(reason)) == 0;
	int built = cloudevent_binary_headers(&ev, "ce-", &h, reason,
					      sizeof(reason)) == 0;
	if (valid != built)
		abort();
	if (built) {
		/* specversion, id, source, type, time, then the row's. */
		cJSON *obj = cJSON_Parse(f.field[0]);
		size_t n = (size_t)cJSON_GetArraySize(obj);
		if (!obj || h.n != 5 + n)
			abort();
		cJSON_Delete(obj);
	}
	ce_headers_release(&h);
	fuzz_fields_free(&f);
	return 0;
}
