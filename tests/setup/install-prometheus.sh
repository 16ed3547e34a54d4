#!/usr/bin/env bash
# Install Prometheus and promtool (Debian's `prometheus` package) for the ops
# tests, when they are not already on PATH (and systemd's offline tools). Idempotent and quiet; meant for CI
# running as root on Debian/Ubuntu. The tests start their own server on
# loopback with a temporary storage dir, so the packaged service must not run:
# a policy-rc.d keeps the maintainer scripts from starting it, and if it was
# started anyway (or a previous install left it running) it is stopped and
# disabled.
set -euo pipefail

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

if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-prometheus.sh: no apt-get here; install prometheus + promtool by hand" >&2
    exit 1
fi

# Refuse service starts from maintainer scripts during this install only.
POLICY=/usr/sbin/policy-rc.d
ADDED_POLICY=0
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$POLICY" >/dev/null
    $SUDO chmod 0755 "$POLICY"
    ADDED_POLICY=1
fi
cleanup() {
    if [ "$ADDED_POLICY" = 1 ]; then $SUDO rm -f "$POLICY"; fi
}
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
LOG=$(mktemp)
if ! { $SUDO apt-get update -qq && \
       # shellcheck disable=SC2086
       $SUDO apt-get install -y -qq --no-install-recommends $PKGS; } >"$LOG" 2>&1; then
    cat "$LOG" >&2
    rm -f "$LOG"
    echo "install-prometheus.sh: apt-get failed (log above)" >&2
    exit 1
fi
rm -f "$LOG"

# Belt and braces: never leave the packaged server running or enabled.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
elif command -v service >/dev/null 2>&1; then
    $SUDO service prometheus stop >/dev/null 2>&1 || true
fi
if [ -x /usr/sbin/update-rc.d ]; then
    $SUDO update-rc.d prometheus disable >/dev/null 2>&1 || true
fi

command -v promtool >/dev/null
command -v prometheus >/dev/null
command -v systemd-analyze >/dev/null
