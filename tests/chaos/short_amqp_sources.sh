#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The chaos harness's short form with RabbitMQ and 10 outbox tables behind
# each relay (docs/design.md §13), for tests/run.sh (suite chaos): 3000
# events over the 10 tables, the same faults (kill -9, a Postgres restart,
# the broker stopped and slowed, SIGSTOP), bounded to 240 s.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/chaos.sh" --mode amqp --events 3000 --sources 10 --duration-cap 240
