#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The benchmark (see bench.py and docs/benchmark.md): prints a Markdown
# table and one JSON line on stdout, progress on stderr.
#
# Usage: tests/bench/bench.sh [--quick] [--runs N] [--sections LIST] [--charts DIR]
#                             [--no-kafka] [--baseline-bin PATH]
#                             [--horizon-hold SECONDS] [--horizon-keys N]
# The relay comes from RELAY_TEST_BIN; without it, an optimized build
# without sanitizers is made (or reused) in build-bench/. Standalone it
# starts its own Postgres, RabbitMQ and Kafka test broker.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
command -v python3 >/dev/null || { echo "bench.sh: python3 not found" >&2; exit 2; }
if [ -z "${RELAY_TEST_BIN:-}" ]; then
	build="$root/build-bench"
	if [ ! -f "$build/build.ninja" ]; then
		meson setup "$build" "$root" --buildtype=debugoptimized \
			-Db_sanitize=none >&2
	fi
	ninja -C "$build" outbox-relay tests/bench/bench_publish \
		tests/bench/bench_consume tests/kafka_mock_broker >&2
	export RELAY_TEST_BIN="$build/outbox-relay"
fi
exec python3 "$root/tests/bench/bench.py" "$@"
