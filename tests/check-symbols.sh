#!/usr/bin/env bash
# Fails if the shared library exports a symbol outside the prosody_ prefix.
set -euo pipefail
lib="$1"
bad=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^prosody_' || true)
if [ -n "$bad" ]; then
  echo "exported symbols without the prosody_ prefix:"; echo "$bad"; exit 1
fi
n=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -c '^prosody_')
echo "ok: $n exported symbols, all prosody_*"
