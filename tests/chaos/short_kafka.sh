#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The chaos harness's short form with the Kafka test broker, for
# tests/run.sh (suite chaos): 3000 events, bounded to 240 s.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/chaos.sh" --mode kafka --events 3000 --duration-cap 240
