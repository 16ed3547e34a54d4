#!/usr/bin/env bash
# Install Debian's headless `chromium` for the report's browser test
# (tests/test_report_browser.py drives it over its DevTools protocol on a pipe,
# so no chromium-driver is needed), when it is not already on PATH.
# Idempotent and quiet; meant for CI running as root on Debian/Ubuntu. Where it
# cannot install (no apt-get, no root, apt failing) it says so and exits 0, and
# the browser test skips with that reason; under CI=true both fail instead.
set -euo pipefail
# shellcheck source=tests/setup/apt-helpers.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-helpers.sh"

for b in chromium chromium-browser; do
    if command -v "$b" >/dev/null 2>&1; then
        exit 0
    fi
done

# In CI the browser test must run: failing to install is an error there. On a
# developer's machine it is said once and the test skips, saying why.
give_up() {
    echo "install-chromium.sh: $1" >&2
    if [ "${CI:-}" = "true" ] || [ "${CI:-}" = "1" ]; then
        exit 1
    fi
    echo "install-chromium.sh: the report's browser test will skip" >&2
    exit 0
}

if [ "$(id -u)" -ne 0 ] && ! command -v sudo >/dev/null 2>&1; then
    give_up "not root and no sudo: install Debian's chromium by hand"
fi
apt_pick_sudo
if ! command -v apt-get >/dev/null 2>&1; then
    give_up "no apt-get here: install chromium by hand"
fi

# fonts-dejavu-core: the report names no web font; the system sans must exist
# for text to render in the screenshot.
if ! apt_quiet_install chromium fonts-dejavu-core; then
    give_up "apt-get failed (log above)"
fi
command -v chromium >/dev/null
