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

/* RabbitMQ over AMQP 0-9-1 with publisher confirms, librabbitmq (amqp.c). */
extern const struct publisher_ops publisher_amqp;

/* librdkafka's idempotent producer, CloudEvents Kafka binding (kafka.c). */
extern const struct publisher_ops publisher_kafka;

#endif
