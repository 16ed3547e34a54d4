#!/usr/bin/env bash
# Install iproute2 (`ip`: network namespaces, links, addresses) for the partition
# tests (tests/test_partition.py), when it is not already on PATH. Idempotent and
# quiet; meant for CI running as root on Debian/Ubuntu. Without root, or where
# network namespaces cannot be made, the tests skip and say why.
set -euo pipefail

if command -v ip >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-iproute2: not root: the partition tests will skip" >&2
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-iproute2: no apt-get: install iproute2 by hand (the partition tests skip without it)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends iproute2 >/dev/null
command -v ip >/dev/null
