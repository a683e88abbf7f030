#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Chaos harness (see chaos.py and docs/chaos.md): relays under kill -9,
# broker stops and alarms, a Postgres restart and SIGSTOP past the lease;
# one verdict line, non-zero exit on any loss.
#
# Usage: tests/chaos/chaos.sh [--events N] [--seed S] [--mode amqp|kafka]
#                             [--duration-cap SECONDS] [--window SECONDS]
# Standalone it starts its own services; the relay binary comes from
# RELAY_TEST_BIN or build-test/outbox-relay (it builds nothing).
set -euo pipefail
command -v python3 >/dev/null || { echo "chaos.sh: python3 not found" >&2; exit 2; }
exec python3 "$(dirname "${BASH_SOURCE[0]}")/chaos.py" "$@"
