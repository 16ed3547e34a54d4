#!/usr/bin/env bash
# Install PostgreSQL's server binaries (Debian's `postgresql` package) for the
# store's tests, when they are missing. Idempotent and quiet; meant for CI
# running as root on Debian/Ubuntu. The tests start their own server
# (tests/pg.py: initdb in a temporary directory as an unprivileged user, a free
# port on 127.0.0.1), so the packaged service must not run: a policy-rc.d keeps
# the maintainer scripts from starting it, and if it was started anyway (or a
# previous install left it running) it is stopped and disabled.
set -euo pipefail

have_initdb() {
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1
}
if have_initdb; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-postgresql.sh: no apt-get here; install PostgreSQL (initdb, pg_ctl) by hand" >&2
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
       $SUDO apt-get install -y -qq --no-install-recommends postgresql; } >"$LOG" 2>&1; then
    cat "$LOG" >&2
    rm -f "$LOG"
    echo "install-postgresql.sh: apt-get failed (log above)" >&2
    exit 1
fi
rm -f "$LOG"

# Belt and braces: never leave the packaged server running or enabled.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now postgresql.service >/dev/null 2>&1 || true
elif command -v service >/dev/null 2>&1; then
    $SUDO service postgresql stop >/dev/null 2>&1 || true
fi
if [ -x /usr/sbin/update-rc.d ]; then
    $SUDO update-rc.d postgresql disable >/dev/null 2>&1 || true
fi

have_initdb
