#!/usr/bin/env bash
# Sandbox egress helpers measured against each other (make bench BENCH=egress):
# TCP throughput from a network namespace to a machine "outside" (another
# namespace behind a veth pair, like the egress test's), through
# slirp4netns (what the supervisor uses) and pasta (passt), against the
# same transfer straight from the host's namespace. One run, one table.
# Needs root, iperf3, slirp4netns, pasta, iproute2. Every process started
# here is stopped by its pid; the namespaces go with their holders.
set -euo pipefail
SECONDS_EACH="${EGRESS_BENCH_SECONDS:-5}"
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# hold NAME: a namespace kept by a sleep; its pid goes into $NAME.
hold() { unshare --net sleep 600 & local pid=$!; pids+=("$pid")
  for _ in $(seq 100); do [ "$(readlink /proc/$pid/ns/net)" != "$(readlink /proc/self/ns/net)" ] && break; sleep 0.02; done
  printf -v "$1" '%s' "$pid"; }

hold outside
ip link add "obn$outside" type veth peer name "obf$outside" netns "$outside"
ip addr add 198.18.250.2/24 dev "obn$outside"; ip link set "obn$outside" up
nsenter -t "$outside" -n ip addr add 198.18.250.1/24 dev "obf$outside"
nsenter -t "$outside" -n ip link set "obf$outside" up
nsenter -t "$outside" -n ip link set lo up

gbits() { python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))'; }
# measure VAR PREFIX...: iperf3 from where PREFIX runs it, Gbit/s into $VAR.
measure() { local var=$1; shift
  nsenter -t "$outside" -n iperf3 -s -1 -B 198.18.250.1 >/dev/null 2>&1 & local server=$!; pids+=("$server"); sleep 0.3
  printf -v "$var" '%s' "$("$@" iperf3 -c 198.18.250.1 -t "$SECONDS_EACH" -J | gbits 2>/dev/null || echo n/a)"
  kill "$server" 2>/dev/null || true
}

measure direct env

hold slirp_ns
slirp4netns --configure --mtu=65520 --disable-host-loopback --enable-sandbox --enable-seccomp "$slirp_ns" tap0 >/dev/null 2>&1 & pids+=($!)
for _ in $(seq 100); do nsenter -t "$slirp_ns" -n ip -br addr show tap0 2>/dev/null | grep -q 10.0.2 && break; sleep 0.05; done
measure slirp nsenter -t "$slirp_ns" -n

hold pasta_ns
pasta_log=$(mktemp)
pasta --config-net --runas 0 -t none -u none -T none -U none --foreground --netns "/proc/$pasta_ns/ns/net" >"$pasta_log" 2>&1 & pids+=($!)
pasta=""
for _ in $(seq 100); do nsenter -t "$pasta_ns" -n ip route 2>/dev/null | grep -q default && break; sleep 0.05; done
if nsenter -t "$pasta_ns" -n ip route 2>/dev/null | grep -q default; then
  measure pasta nsenter -t "$pasta_ns" -n
else
  pasta="n/a"
  echo "pasta did not configure the namespace: $(grep -v syslog "$pasta_log" | tail -1)"
fi
rm -f "$pasta_log"

ratio() { python3 -c "import sys; a, b = sys.argv[1:]; print('%.2fx' % (float(a) / float(b)) if 'n/a' not in (a, b) else 'n/a')" "$1" "$2"; }
printf '%-34s %10s %8s\n' "egress path (TCP, iperf3 ${SECONDS_EACH} s)" "Gbit/s" "ratio"
printf '%-34s %10s %8s\n' "host namespace, straight" "$direct" "1.00x"
printf '%-34s %10s %8s\n' "slirp4netns 1.2 (mtu 65520)" "$slirp" "$(ratio "$slirp" "$direct")"
printf '%-34s %10s %8s\n' "pasta (passt 2023-03)" "$pasta" "$(ratio "$pasta" "$direct")"
printf '%-34s %10s\n' "pasta vs slirp4netns" "$(ratio "$pasta" "$slirp")"
