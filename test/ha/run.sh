#!/usr/bin/env bash
# status_history under pg_auto_failover: a monitor and two data nodes on
# 127.0.0.1, reporters and a controller (psycopg 3, multi-host connection
# string), the primary killed twice under load, every guarantee checked after
# each failover.  See test/ha/ha.py for the steps and docs/HA.md for the setup.
#
#   ./test/ha/run.sh              synchronous replication (the supported setup)
#   HA_SYNC=0 ./test/ha/run.sh    asynchronous: shows what the checks catch then
#   HA_IMPORT=0                   no import of a row stamped an hour ahead
#   HA_PRELOAD=0                  do not preload the library
#   HA_KEEP=1                     keep the scratch directory (logs, data)
#
# Runs as root (or with sudo): installs what it needs from Debian, builds and
# installs the extension, then runs the cluster and the clients as postgres in
# a scratch directory under /tmp.  Closes with "N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/deps.sh

ha_packages=(postgresql-15-auto-failover pg-auto-failover-cli python3-psycopg)
ha_missing=()
for p in "${ha_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || ha_missing+=("$p")
done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#ha_missing[@]} -gt 0 ]; then
    echo "== installing: ${ha_missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${ha_missing[@]}" >/dev/null
fi
sh_build_install

scratch=$(mktemp -d /tmp/status_history_ha.XXXXXX)
# Processes whose environment names the scratch directory: the driver and
# all it started (pg_autoctl, the servers and their children, the clients).
ha_ours() {
    local d
    for d in /proc/[0-9]*; do
        if { tr '\0' '\n' < "$d/environ"; } 2>/dev/null |
                grep -qx -e "HA_SCRATCH=$1" -e "XDG_RUNTIME_DIR=$1/run"; then
            echo "${d#/proc/}"
        fi
    done
}
cleanup() {
    # The driver stops everything itself unless it was killed; kill what is
    # left of ours, by pid.
    local pids
    if [ -z "$SUDO" ]; then
        pids=$(ha_ours "$scratch")
    else
        pids=$($SUDO bash -c "$(declare -f ha_ours); ha_ours '$scratch'")
    fi
    # shellcheck disable=SC2086
    [ -z "$pids" ] || $SUDO kill -KILL $pids 2>/dev/null || true
    if [ -n "${HA_KEEP:-}" ]; then
        echo "kept $scratch"
    else
        $SUDO rm -rf "$scratch"
    fi
}
trap cleanup EXIT
cp test/ha/ha.py test/ha/client.py "$scratch/"
run=()
if [ "$(id -u)" -eq 0 ]; then
    chown -R postgres "$scratch"
    run=(runuser -u postgres --)
else
    $SUDO chown -R postgres "$scratch"
    run=(sudo -u postgres)
fi
cd "$scratch"
"${run[@]}" env HA_SCRATCH="$scratch" HA_SYNC="${HA_SYNC:-1}" HA_REPORTERS="${HA_REPORTERS:-3}" \
    HA_OBJECTS="${HA_OBJECTS:-200}" HA_PRELOAD="${HA_PRELOAD:-1}" HA_IMPORT="${HA_IMPORT:-1}" \
    timeout -k 10 "${HA_TIMEOUT:-600}" /usr/bin/python3 -u "$scratch/ha.py"
