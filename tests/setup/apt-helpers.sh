# Sourced (not run) by the install-*.sh scripts: the steps they share for a
# quiet, idempotent apt install in CI. Each caller keeps its own "already
# installed?" check and its own wording of what went wrong.

# SUDO: empty as root, else "sudo" (the caller decides whether sudo may be missing).
apt_pick_sudo() {
    if [ "$(id -u)" -ne 0 ]; then
        SUDO=sudo
    else
        SUDO=
    fi
}

# apt_quiet_install PKG...: apt-get update and install without recommends.
# Silent on success; on failure the whole apt log goes to stderr and it returns
# 1, so the caller says what failed in its own name.
apt_quiet_install() {
    export DEBIAN_FRONTEND=noninteractive
    local log
    log=$(mktemp)
    if ! { $SUDO apt-get update -qq && \
           $SUDO apt-get install -y -qq --no-install-recommends "$@"; } >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        return 1
    fi
    rm -f "$log"
}

# The tests start their own servers, so a package's service must not start
# from its maintainer scripts: a policy-rc.d refuses service starts during this
# install only (removed again on exit, if this script added it).
APT_POLICY=/usr/sbin/policy-rc.d
APT_ADDED_POLICY=0
apt_block_service_starts() {
    if [ ! -e "$APT_POLICY" ]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$APT_POLICY" >/dev/null
        $SUDO chmod 0755 "$APT_POLICY"
        APT_ADDED_POLICY=1
    fi
    trap apt_unblock_service_starts EXIT
}
apt_unblock_service_starts() {
    if [ "$APT_ADDED_POLICY" = 1 ]; then $SUDO rm -f "$APT_POLICY"; fi
}

# apt_service_off NAME: belt and braces: never leave the packaged service
# running or enabled (it may have been started anyway, or by an earlier install).
apt_service_off() {
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        $SUDO systemctl disable --now "$1.service" >/dev/null 2>&1 || true
    elif command -v service >/dev/null 2>&1; then
        $SUDO service "$1" stop >/dev/null 2>&1 || true
    fi
    if [ -x /usr/sbin/update-rc.d ]; then
        $SUDO update-rc.d "$1" disable >/dev/null 2>&1 || true
    fi
}
