#!/usr/bin/env bash
# Fails if docs/CONFIGURATION.md differs from what the option table
# generates (`make docs` regenerates it).
set -euo pipefail
cli="$1"; doc="$2"
if ! diff -u "$doc" <(env -i PATH="$PATH" ${TSAN_OPTIONS:+TSAN_OPTIONS="$TSAN_OPTIONS"} ${ASAN_OPTIONS:+ASAN_OPTIONS="$ASAN_OPTIONS"} "$cli" config --markdown); then
  echo "docs/CONFIGURATION.md is stale: run 'make docs'"; exit 1
fi
echo "ok: docs/CONFIGURATION.md is current"
