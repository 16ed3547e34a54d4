#!/usr/bin/env bash
# Install PostgreSQL's server binaries (Debian's `postgresql` package) for the
# store's tests, when they are missing. Idempotent and quiet; meant for CI
# running as root on Debian/Ubuntu. The tests start their own server
# (tests/pg.py: initdb in a temporary directory as an unprivileged user, a free
# port on 127.0.0.1), so the packaged service must not run: a policy-rc.d keeps
# the maintainer scripts from starting it, and if it was started anyway (or a
# previous install left it running) it is stopped and disabled.
set -euo pipefail
# shellcheck source=tests/setup/apt-helpers.sh
source "$(dirname "${BASH_SOURCE[0]}")/apt-helpers.sh"

have_initdb() {
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null 2>&1
}
if have_initdb; then
    exit 0
fi

apt_pick_sudo
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-postgresql.sh: no apt-get here; install PostgreSQL (initdb, pg_ctl) by hand" >&2
    exit 1
fi

apt_block_service_starts
if ! apt_quiet_install postgresql; then
    echo "install-postgresql.sh: apt-get failed (log above)" >&2
    exit 1
fi
apt_service_off postgresql

have_initdb
