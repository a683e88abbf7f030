#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Partition harness (see partition.py and docs/chaos.md): three relays in
# network namespaces cut off from Postgres, from the broker and from both,
# on a seeded schedule; one verdict line, non-zero exit on any loss, late
# mark accepted or relay that did not come back.
#
# Usage: tests/partition/partition.sh [--mode amqp|kafka] [--seed S]
#            [--short] [--passes P] [--rate EVENTS_PER_S] [--duration-cap S]
# Needs root (ip netns). Standalone it starts its own services; the relay
# binary comes from RELAY_TEST_BIN or build-test/outbox-relay.
set -euo pipefail
command -v python3 >/dev/null || { echo "partition.sh: python3 not found" >&2; exit 2; }
exec python3 "$(dirname "${BASH_SOURCE[0]}")/partition.py" "$@"
