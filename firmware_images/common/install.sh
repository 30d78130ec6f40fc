#!/usr/bin/env bash
# Install the edgesdk agent from this provisioning image. Needs no network: every wheel is
# in wheelhouse/, checked against SHA256SUMS before anything is installed.
#
#   sudo ./install.sh [--device-id ID]                 # on the device (systemd, user edgesdk)
#   ./install.sh --root DIR [--python PY] [--no-start] # staged into DIR (tests, image builds)
#
# With --root (or when not run as root) paths are prefixed with DIR, no user is created,
# nothing is chowned and systemd is left alone: the result can be started by hand with the
# ExecStart line of DIR/etc/systemd/system/edge-agent.service.
set -euo pipefail
# Modes come from layout.tsv (private files are chmod-ed there), not from the caller's umask: a
# hardened root's 077 made the venv unreadable to the agent's user ("user edgesdk cannot run").
umask 022

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$HERE/image.env"

ROOT=/
DEVICE_ID=""
PYTHON=python3
START=1
FORCE_CONFIG=0

die() { echo "install.sh: error: $*" >&2; exit 1; }
step() { echo "==> $*"; }

usage() {
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    echo "options: --root DIR, --device-id ID, --python PATH, --no-start, --force-config"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --root) ROOT=${2:?--root needs a directory}; shift 2 ;;
        --device-id) DEVICE_ID=${2:?--device-id needs a value}; shift 2 ;;
        --python) PYTHON=${2:?--python needs a path}; shift 2 ;;
        --no-start) START=0; shift ;;
        --force-config) FORCE_CONFIG=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

# The wheels are for one CPU: say so before pip fails on "no matching distribution". Images
# built before image.env named the CPU skip this (pip's error is then what stops them).
if [ -n "${EDGESDK_IMAGE_ARCH:-}" ]; then
    MACHINE=$(uname -m)
    case "$MACHINE" in arm64) MACHINE=aarch64 ;; armv8l) MACHINE=armv7l ;; esac
    # A 32-bit userland on a 64-bit Arm kernel (32-bit Raspberry Pi OS on a Pi 4) reports
    # aarch64, but its Python takes armv7l wheels.
    if [ "$MACHINE" = aarch64 ] && [ "$(getconf LONG_BIT 2>/dev/null || echo 64)" = 32 ]; then MACHINE=armv7l; fi
    [ "$MACHINE" = "$EDGESDK_IMAGE_ARCH" ] || die "this image is for $EDGESDK_IMAGE_ARCH ($EDGESDK_IMAGE_PROFILE); this machine is $MACHINE: build one with \`edgesdk image build --profile PROFILE\` naming an $MACHINE profile (\`edgesdk profiles list\` shows each one's cpu)"
fi

# P is the prefix put before every absolute path: empty on a real device.
if [ "$ROOT" = "/" ]; then P=""; else mkdir -p "$ROOT"; P=$(cd "$ROOT" && pwd); fi
if [ "$(id -u)" = 0 ] && [ -z "$P" ]; then SYSTEM=1; else SYSTEM=0; fi

step "checking the image against SHA256SUMS"
(cd "$HERE" && sha256sum --quiet --strict -c SHA256SUMS) || die "image is corrupt: a file does not match SHA256SUMS"

if [ -z "$DEVICE_ID" ]; then
    # The host name is what an operator sees in `edgesdk fleet enroll list`; make it a valid id.
    DEVICE_ID=$(hostname | tr -c 'A-Za-z0-9._\n-' '-' | cut -c1-64)
fi
printf '%s' "$DEVICE_ID" | grep -Eq '^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$' \
    || die "device id '$DEVICE_ID' is invalid: use letters, digits, '.', '_', '-' (max 64)"

step "checking Python"
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || die "no Python at '$PYTHON' (use --python)"
[ "$PYVER" = "$EDGESDK_IMAGE_PYTHON" ] || die "this image's wheels are for Python $EDGESDK_IMAGE_PYTHON (profile $EDGESDK_IMAGE_PROFILE) but $PYTHON is Python $PYVER"

if [ "$SYSTEM" = 1 ]; then
    step "creating user edgesdk"
    if ! getent passwd edgesdk >/dev/null; then
        useradd --system --user-group --home-dir /var/lib/edgesdk --no-create-home \
            --shell /usr/sbin/nologin --comment "edgesdk device agent" edgesdk
    fi
    for group in $EDGESDK_IMAGE_GROUPS; do
        if getent group "$group" >/dev/null; then usermod -aG "$group" edgesdk; fi
    done
else
    step "staged install into ${P:-/} (no user, no chown, no systemd)"
fi

step "creating directories"
grep -v '^#' "$HERE/layout.tsv" | while IFS=$'\t' read -r path mode owner; do
    [ -n "$path" ] || continue
    mkdir -p "$P$path"
    chmod "$mode" "$P$path"
    if [ "$SYSTEM" = 1 ]; then chown "$owner" "$P$path"; fi
done

VENV="$P/opt/edgesdk/venv"
step "creating $VENV"
"$PYTHON" -m venv --clear "$VENV" || die "'$PYTHON -m venv' failed (on Debian: install python3-venv)"
if [ "$SYSTEM" = 1 ] && ! why=$(runuser -u edgesdk -- "$VENV/bin/python" -c '' 2>&1); then
    # What the system said goes in the line: a closed directory is the usual cause, not the only one.
    why=$(printf '%s' "$why" | tr '\n' ' ' | cut -c1-200)
    die "user edgesdk cannot run $PYTHON (a Python under /root or a home directory?); use the system Python${why:+ ($why)}"
fi

step "installing $EDGESDK_IMAGE_REQUIREMENT from the wheelhouse (no network)"
# No index, no user pip.conf, no inherited find-links: only this image's wheels can be used.
env PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS="$HERE/wheelhouse" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    "$VENV/bin/python" -m pip install --quiet --no-index --find-links "$HERE/wheelhouse" \
    --only-binary=:all: "$EDGESDK_IMAGE_REQUIREMENT" \
    || die "pip could not install $EDGESDK_IMAGE_REQUIREMENT from $HERE/wheelhouse"

step "installing the overlay (unit, config, trust anchors)"
(cd "$HERE/overlay" && find . -type f | sort) | while read -r rel; do
    rel=${rel#./}
    dest="$P/$rel"
    mkdir -p "$(dirname "$dest")"
    if [ "$rel" = "etc/edgesdk/agent.toml" ] && [ -e "$dest" ] && [ "$FORCE_CONFIG" = 0 ]; then
        # Keep the device's existing identity and settings; show the new defaults beside them.
        dest="$dest.new"
        echo "    keeping existing /$rel (new one written to /$rel.new; --force-config replaces it)"
    fi
    sed -e "s|@ROOT@|$P|g" -e "s|@DEVICE_ID@|$DEVICE_ID|g" "$HERE/overlay/$rel" > "$dest"
    case "$rel" in
        etc/edgesdk/agent.toml) chmod 0640 "$dest" ;;
        usr/local/bin/*) chmod 0755 "$dest" ;;
        *) chmod 0644 "$dest" ;;
    esac
    if [ "$SYSTEM" = 1 ]; then
        case "$rel" in etc/edgesdk/*) chown root:edgesdk "$dest" ;; *) chown root:root "$dest" ;; esac
    fi
done

if [ -f "$HERE/bundle/initial.edgepkg" ]; then
    step "installing the initial model bundle"
    INBOX="$P/var/lib/edgesdk/inbox/initial.edgepkg"
    install -m 0600 "$HERE/bundle/initial.edgepkg" "$INBOX"
    if [ "$SYSTEM" = 1 ]; then chown edgesdk:edgesdk "$INBOX"; fi
    # Bundles are encrypted to enrolled device keys: this works for a device that was enrolled
    # before (re-imaged with its state kept); a new device gets its model after approval (OTA).
    if "$P/usr/local/bin/edge-agent" install --no-reload "$INBOX"; then
        rm -f "$INBOX"
    else
        echo "    not installed: this device cannot open the bundle yet (see above); it stays in the inbox."
        echo "    Approve the device (edgesdk fleet enroll approve) and push the model to it."
    fi
fi

UNIT="$P/etc/systemd/system/edge-agent.service"
if [ "$SYSTEM" = 1 ] && [ "$START" = 1 ] && [ -d /run/systemd/system ]; then
    step "enabling and starting edge-agent.service"
    systemctl daemon-reload
    systemctl enable edge-agent.service
    # restart, not start: re-running the installer upgrades a device whose agent is running.
    systemctl restart edge-agent.service
    echo "    the agent made its device key on first start; show its public key with: edge-agent key"
    echo "    then, on the operator machine: edgesdk fleet enroll approve $DEVICE_ID --broker URL"
else
    step "not starting the service; start the agent with the unit's ExecStart:"
    echo "    $(sed -n 's/^ExecStart=//p' "$UNIT")"
fi
step "installed edgesdk agent for profile $EDGESDK_IMAGE_PROFILE as device '$DEVICE_ID'"
