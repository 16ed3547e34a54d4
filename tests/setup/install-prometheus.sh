#!/usr/bin/env bash
# Install Prometheus and promtool (Debian's `prometheus` package) for the ops
# tests, when they are not already on PATH (and systemd's offline tools). Idempotent and quiet; meant for CI
# running as root on Debian/Ubuntu. The tests start their own server on
# loopback with a temporary storage dir, so the packaged service must not run:
# a policy-rc.d keeps the maintainer scripts from starting it, and if it was
# started anyway (or a previous install left it running) it is stopped and
# disabled.
set -euo pipefail
# shellcheck source=tests/setup/apt-helpers.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-helpers.sh"

# The ops tests also run systemd-analyze, systemd-sysusers and systemd-tmpfiles
# (package systemd) against unit files; they never need systemd running.
PKGS=""
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    PKGS="prometheus"
fi
if ! command -v systemd-analyze >/dev/null 2>&1 || ! command -v systemd-tmpfiles >/dev/null 2>&1 \
        || ! command -v systemd-sysusers >/dev/null 2>&1; then
    PKGS="$PKGS systemd"
fi
if [ -z "$PKGS" ]; then
    exit 0
fi

apt_pick_sudo
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-prometheus.sh: no apt-get here; install prometheus + promtool by hand" >&2
    exit 1
fi

apt_block_service_starts
# shellcheck disable=SC2086
if ! apt_quiet_install $PKGS; then
    echo "install-prometheus.sh: apt-get failed (log above)" >&2
    exit 1
fi
apt_service_off prometheus

command -v promtool >/dev/null
command -v prometheus >/dev/null
command -v systemd-analyze >/dev/null
