#!/usr/bin/env bash
# Install or update edgemon on an edge box. Safe to run again: every step checks first, the
# config is never overwritten, and a running service is restarted onto the new code.
#
#   sudo deploy/install.sh [--dry-run] [--python PYTHON] [SOURCE]
#
# PYTHON (default /usr/bin/python3) must be 3.11 or later with venv (Debian: python3-venv),
# and outside /root and /home: the venv links to it, and the service cannot see those.
# SOURCE is a wheel (edgemon-*.whl) or a source tree with pyproject.toml; default: the tree
# this script is in. The config and unit come from the deploy/ directory next to this
# script, so copy the whole deploy/ directory to the box together with a wheel.
#
# What it does:
#   1. a system user "edgemon" (no login, no home) that the unit runs as
#   2. a virtualenv in /opt/edgemon/venv with edgemon installed from SOURCE
#   3. /etc/edgemon/edgemon.toml (root:edgemon 0640) from deploy/edgemon.toml, if absent,
#      then `edgemon check-config` on it
#   4. /etc/systemd/system/edgemon.service, daemon-reload, enable, start (or restart)
#
# --dry-run prints the commands that change something instead of running them (checks still
# run, so the plan matches this box); it needs no root.
set -euo pipefail
umask 022 # the venv and unit must be readable by the service user and systemd

readonly PREFIX=/opt/edgemon
readonly VENV=$PREFIX/venv
readonly CONFIG_DIR=/etc/edgemon
readonly CONFIG=$CONFIG_DIR/edgemon.toml
readonly UNIT=/etc/systemd/system/edgemon.service
readonly SERVICE_USER=edgemon

DEPLOY_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
readonly DEPLOY_DIR

dry_run=false
python=/usr/bin/python3
source_path=$(dirname -- "$DEPLOY_DIR")

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
}

die() {
    echo "install.sh: $*" >&2
    exit 2
}

# Run a command that changes the box, or print it with --dry-run.
run() {
    if $dry_run; then
        printf '+'
        printf ' %q' "$@"
        printf '\n'
    else
        "$@"
    fi
}

say() {
    echo "==> $*"
}

while (($#)); do
    case $1 in
        --dry-run) dry_run=true ;;
        --python)
            (($# >= 2)) || die "--python needs a value"
            python=$2
            shift
            ;;
        -h | --help)
            usage
            exit 0
            ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) source_path=$1 ;;
    esac
    shift
done

if [[ -f $source_path && $source_path == *.whl ]]; then
    :
elif [[ -f $source_path/pyproject.toml ]]; then
    :
else
    die "$source_path is neither a wheel (*.whl) nor a source tree with pyproject.toml"
fi
source_path=$(realpath -- "$source_path")
for file in "$DEPLOY_DIR/edgemon.toml" "$DEPLOY_DIR/systemd/edgemon.service"; do
    [[ -f $file ]] || die "$file is missing: run the script from a full deploy/ directory"
done
if ! $dry_run && ((EUID != 0)); then
    die "run as root (or with --dry-run to see the steps)"
fi
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null ||
    die "$python is not Python 3.11 or later (choose one with --python)"
"$python" -c 'import ensurepip, venv' 2>/dev/null ||
    die "$python cannot make a virtualenv (Debian: apt-get install python3-venv)"
# The service runs with ProtectHome=yes as an unprivileged user: an interpreter under a home
# directory (pyenv, conda) would be invisible to it, and the venv only links to it.
check_visible() {
    local real
    real=$("$1" -c 'import os, sys; print(os.path.realpath(sys.executable))')
    case $real in
        /root/* | /home/* | /run/user/*)
            die "$1 is $real, under a home directory the service cannot see; use --python" ;;
    esac
}
check_visible "$python"

say "user $SERVICE_USER"
if getent passwd "$SERVICE_USER" >/dev/null; then
    echo "exists"
else
    # The unit says DynamicUser=yes with User=edgemon: systemd uses this static user when it
    # exists, so the config and secret files can be group/owner-readable by it.
    run useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin --comment "edgemon daemon" "$SERVICE_USER"
fi

say "virtualenv $VENV"
if [[ -x $VENV/bin/python ]]; then
    echo "exists"
    check_visible "$VENV/bin/python"
else
    run install -d -m 0755 "$PREFIX"
    run "$python" -m venv "$VENV"
fi
run "$VENV/bin/pip" install --quiet --disable-pip-version-check --upgrade "$source_path"

say "config $CONFIG"
run install -d -m 0755 -o root -g root "$CONFIG_DIR"
if [[ -e $CONFIG ]]; then
    echo "exists, left as it is"
else
    # Group-readable by the daemon, writable by root only (check-config warns otherwise).
    run install -m 0640 -o root -g "$SERVICE_USER" "$DEPLOY_DIR/edgemon.toml" "$CONFIG"
fi
# As the service user, so unreadable secret files show up now rather than at start.
if $dry_run; then
    run runuser -u "$SERVICE_USER" -- "$VENV/bin/edgemon" check-config "$CONFIG"
else
    runuser -u "$SERVICE_USER" -- "$VENV/bin/edgemon" check-config "$CONFIG" >/dev/null
    echo "valid"
fi

say "unit $UNIT"
if [[ -f $UNIT ]] && cmp -s "$DEPLOY_DIR/systemd/edgemon.service" "$UNIT"; then
    echo "unchanged"
else
    run install -m 0644 -o root -g root "$DEPLOY_DIR/systemd/edgemon.service" "$UNIT"
fi
run systemctl daemon-reload
# The service is ready once subscribed to the broker: start blocks until then (at most
# TimeoutStartSec), so set the broker up first (deploy/mosquitto/README).
if systemctl is-active --quiet edgemon.service 2>/dev/null; then
    say "restarting edgemon.service onto the installed code"
    run systemctl enable edgemon.service
    run systemctl restart edgemon.service
else
    say "enabling and starting edgemon.service"
    run systemctl enable --now edgemon.service
fi
say "done: systemctl status edgemon; journalctl -u edgemon -f"
