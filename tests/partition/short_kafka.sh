#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The partition harness's short form with the Kafka test broker, for tests/run.sh
# (suite partition): three faults at once and an all-cut, under a minute.
set -euo pipefail
exec bash "$(dirname "${BASH_SOURCE[0]}")/partition.sh" --mode kafka --short --duration-cap 170
