#!/usr/bin/env bash
# Installs what a fresh machine of this kind lacks. Idempotent: each step
# checks first and does nothing when the tool is already there.
set -euo pipefail

need_rustup_component() {
  if ! cargo "$1" --version >/dev/null 2>&1; then
    echo "setup: installing rust component $2"
    rustup component add "$2"
  fi
}

command -v cargo >/dev/null || { echo "setup: cargo is required (rustup)"; exit 1; }
need_rustup_component fmt rustfmt
need_rustup_component clippy clippy

# Debian packages the tests run as real processes: nginx (the edge tests run
# deploy/nginx unprivileged) and the PostgreSQL server (cluster tests).
# Installed without starting their system services.
install_deb() {
  local package="$1"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: $package is missing and there is no apt-get: install it by hand"
    exit 1
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup: installing $package needs root (or sudo)"; exit 1; }
    sudo="sudo"
  fi
  echo "setup: installing $package"
  # policy-rc.d answering 101 keeps the package from starting the service;
  # only a file created here is removed again.
  local policy=/usr/sbin/policy-rc.d created=""
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    created=1
  fi
  local status=0
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" || status=$?
  if [ -n "$created" ]; then
    $sudo rm -f "$policy"
  fi
  if [ "$status" -ne 0 ]; then
    echo "setup: installing $package failed"
    exit "$status"
  fi
}
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  install_deb nginx
fi
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  install_deb postgresql
fi
# libfaketime: the clock-skew test starts a replica with its clock shifted.
if [ ! -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ]; then
  install_deb faketime
fi
# The SSH tests drive the system's own OpenSSH client (ssh, scp, sftp,
# ssh-keyscan, ssh-keygen) and rsync, on both ends of the connection; the
# CLI's `ssh-proxy --port` tests start an sshd inside a sandbox (server).
if ! command -v ssh >/dev/null 2>&1 || ! command -v ssh-keyscan >/dev/null 2>&1; then
  install_deb openssh-client
fi
if [ ! -x /usr/sbin/sshd ]; then
  install_deb openssh-server
fi
if ! command -v rsync >/dev/null 2>&1; then
  install_deb rsync
fi
# Sandbox egress: slirp4netns gives a sandbox whose network policy allows
# outbound traffic user-mode networking; the egress test drives it, and `ip`
# (iproute2) builds the test's outside machine.
if ! command -v slirp4netns >/dev/null 2>&1; then
  install_deb slirp4netns
fi
if ! command -v ip >/dev/null 2>&1; then
  install_deb iproute2
fi
# TypeScript SDK: Node 20.17 or newer with npm (the Node packages themselves
# are pinned by sdk-typescript/package-lock.json and installed by `make node`).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "setup: Node.js 20.17 or newer with npm is required (https://nodejs.org)"
  exit 1
fi
if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number);process.exit(a>20||(a===20&&b>=17)?0:1)'; then
  echo "setup: Node.js $(node --version) is too old: 20.17 or newer is required"
  exit 1
fi

# Python SDK: the project venv (.venv, gitignored) with the pinned tools of
# sdk-python/requirements-dev.txt. pip runs only when the venv is new or the
# pins changed (the installed pins are remembered in the venv).
python_venv() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  local venv="$root/.venv" requirements="$root/sdk-python/requirements-dev.txt"
  local stamp="$venv/.openshell-requirements"
  command -v python3 >/dev/null || { echo "setup: python3 (3.11+) is required"; exit 1; }
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating $venv"
    python3 -m venv "$venv"
  fi
  if [ -f "$stamp" ] && cmp -s "$stamp" "$requirements" \
    && "$venv/bin/python" -m pip check >/dev/null 2>&1; then
    return
  fi
  echo "setup: installing Python packages into $venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
  cp "$requirements" "$stamp"
}
python_venv
echo "setup: ok"
