#!/usr/bin/env bash
# What `make bench` needs beyond `make setup`: iperf3 (the program on both
# ends of every forward figure), socat (the plain TCP relay chain the
# forward is compared with), slirp4netns and pasta (BENCH=egress). Idempotent: installs only what is missing,
# without starting any service (iperf3's package offers a daemon).
set -euo pipefail

missing=()
command -v iperf3 >/dev/null 2>&1 || missing+=(iperf3)
command -v socat >/dev/null 2>&1 || missing+=(socat)
# BENCH=egress compares the two user-mode networking helpers.
command -v slirp4netns >/dev/null 2>&1 || missing+=(slirp4netns)
command -v pasta >/dev/null 2>&1 || missing+=(passt)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "bench-setup: ${missing[*]} missing and there is no apt-get: install them by hand"
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "bench-setup: installing ${missing[*]} needs root (or sudo)"; exit 1; }
  sudo="sudo"
fi
echo "bench-setup: installing ${missing[*]}"
# policy-rc.d answering 101 keeps a package from starting its service; only
# a file created here is removed again. debconf: no iperf3 daemon.
policy=/usr/sbin/policy-rc.d
created=""
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod 755 "$policy"
  created=1
fi
status=0
echo "iperf3 iperf3/start_daemon boolean false" | $sudo debconf-set-selections 2>/dev/null || true
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" || status=$?
if [ -n "$created" ]; then
  $sudo rm -f "$policy"
fi
if [ "$status" -ne 0 ]; then
  echo "bench-setup: installing ${missing[*]} failed"
  exit "$status"
fi
