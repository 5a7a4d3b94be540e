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
echo "setup: ok"
