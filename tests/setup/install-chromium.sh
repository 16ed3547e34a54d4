#!/usr/bin/env bash
# Install Debian's headless `chromium` for the report's browser test
# (tests/test_report_browser.py drives it over its DevTools protocol on a pipe,
# so no chromium-driver is needed), when it is not already on PATH.
# Idempotent and quiet; meant for CI running as root on Debian/Ubuntu. On a
# machine without apt-get it says so and exits 0: the browser test then skips
# with that reason, except under CI=true, where it fails (the test checks).
set -euo pipefail

for b in chromium chromium-browser; do
    if command -v "$b" >/dev/null 2>&1; then
        exit 0
    fi
done

if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chromium.sh: no apt-get here; install chromium by hand for the report's browser test" >&2
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
LOG=$(mktemp)
# fonts-dejavu-core: the report names no web font; the system sans must exist
# for text to render in the screenshot.
if ! { $SUDO apt-get update -qq && \
       $SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core; } >"$LOG" 2>&1; then
    cat "$LOG" >&2
    rm -f "$LOG"
    echo "install-chromium.sh: apt-get failed (log above)" >&2
    exit 1
fi
rm -f "$LOG"
command -v chromium >/dev/null
