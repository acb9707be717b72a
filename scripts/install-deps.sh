#!/usr/bin/env bash
# Installs the system packages the tests need (Debian): iproute2 for the
# tests that build their own network namespaces. Idempotent; does nothing
# when the tools are present. Without root it only reports what is missing
# (the namespace tests then skip with a message).
set -euo pipefail

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
	echo "install-deps: missing ${missing[*]} and not root; tests that need them will skip" >&2
	exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
