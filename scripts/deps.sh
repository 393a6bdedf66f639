#!/usr/bin/env bash
# Installs every system package Prosody-C needs to build, test and benchmark.
# librdkafka is not among them: Debian 12's is 2.0.2, below our floor of
# 2.10.0, so scripts/librdkafka.sh builds a current one from Debian's own
# source package (called by CMake when the system has none that is new
# enough); the packages below carry what that build needs (dpkg-dev for
# dpkg-source, and the libraries librdkafka links dynamically).
# Idempotent: packages already present are not reinstalled and apt-get update
# runs only when something is missing. Run as root or with sudo available.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config
  libuv1-dev libjansson-dev libmicrohttpd-dev
  libcurl4-openssl-dev libxxhash-dev libcmocka-dev
  dpkg-dev libssl-dev libsasl2-dev libzstd-dev liblz4-dev zlib1g-dev
  valgrind clang clang-format libclang-rt-dev
  python3 python3-venv python3-dev maven openjdk-17-jre-headless
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# .ci/run updates the package lists once and says so.
[ "${PROSODY_APT_UPDATED:-0}" = 1 ] || $SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "deps: done"
