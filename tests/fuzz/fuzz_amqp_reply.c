/* SPDX-License-Identifier: MIT */
/*
 * What a broker or librabbitmq says back: the refusal parser of
 * channel.close texts, the close and RPC reply descriptions. Input: one
 * byte for the reply type, two for the reply code, two for the library
 * error or method, then the reply text (binary, not terminated).
 * Oracle: descriptions are one line (no control character) and a
 * parsed refusal's names are terminated within their buffers.
 */
#include <amqp.h>
#include <amqp_framing.h>
#include <stdlib.h>
#include <string.h>

#include "publishers/amqp_map.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void one_line(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 5)
		return 0;
	static const uint16_t codes[] = {AMQP_NOT_FOUND, AMQP_ACCESS_REFUSED,
					 AMQP_PRECONDITION_FAILED, 320, 0};
	uint16_t code = (data[1] & 0x80) ? (uint16_t)(data[1] << 8 | data[2])
					 : codes[data[1] % 5];
	int sel = (int)(data[3] << 8 | data[4]);
	size_t len = size - 5;
	/* Exact size: ASan sees any read past the text. */
	char *text = malloc(len ? len : 1);
	if (!text)
		abort();
	memcpy(text, data + 5, len);

	struct rmq_refusal r;
	rmq_refusal_parse(code, len ? text : NULL, len, &r);
	if (!memchr(r.exchange, 0, sizeof(r.exchange)) ||
	    !memchr(r.routing_key, 0, sizeof(r.routing_key)))
		abort();
	rmq_refusal_parse(code, text, len, &r);

	char buf[256];
	amqp_bytes_t bytes = {.len = len, .bytes = text};
	rmq_map_describe_close(code, bytes, buf, sizeof(buf));
	one_line(buf);

	amqp_connection_close_t cc = {.reply_code = code, .reply_text = bytes};
	amqp_channel_close_t ch = {.reply_code = code, .reply_text = bytes};
	amqp_rpc_reply_t reply = {.reply_type =
				      (amqp_response_type_enum)(data[0] % 5)};
	switch (sel % 3) {
	case 0:
		reply.reply.id = AMQP_CONNECTION_CLOSE_METHOD;
		reply.reply.decoded = &cc;
		break;
	case 1:
		reply.reply.id = AMQP_CHANNEL_CLOSE_METHOD;
		reply.reply.decoded = &ch;
		break;
	default:
		reply.reply.id = AMQP_BASIC_ACK_METHOD;
		break;
	}
	reply.library_error = (sel % 64) - 32;
	rmq_map_describe_reply(reply, buf, sizeof(buf));
	one_line(buf);

	/* A reason cut mid-character by snprintf. */
	char *cut = malloc(len + 1);
	if (!cut)
		abort();
	memcpy(cut, text, len);
	cut[len] = '\0';
	rmq_map_utf8_cut(cut);
	free(cut);
	free(text);
	return 0;
}
