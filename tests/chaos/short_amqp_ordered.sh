#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The chaos harness's short form in ordered mode with RabbitMQ, for
# tests/run.sh (suite chaos): 2000 events over 64 keys, the same faults,
# and each key's first deliveries checked in seq order; bounded to 240 s.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/chaos.sh" --mode amqp --events 2000 --ordered --duration-cap 240
