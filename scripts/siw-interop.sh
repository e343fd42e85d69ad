#!/usr/bin/env bash
# Interop between barewire's two backends on the wire: the verbs backend on Linux siw against
# the soft backend, in both directions, with RDMA WRITE, READ and SEND (bytes checked by
# `barewire-peer check`). Both speak iWARP (MPA/DDP/RDMAP) over TCP on 127.0.0.1.
#
# Needs root and a kernel that can load siw (`modprobe siw`); rdma (iproute2) adds the device:
#   rdma link add siw0 type siw netdev lo
# On a machine whose kernel cannot load siw this script says so and exits 2.
# Usage: scripts/siw-interop.sh            (add CAPTURE=1 to keep a pcap of lo for tshark)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

if ! modprobe siw 2>/dev/null && [ ! -d /sys/module/siw ]; then
  echo "siw-interop: this kernel cannot load siw (modprobe siw failed); run on a machine that can" >&2
  exit 2
fi
rdma link show siw0 >/dev/null 2>&1 || rdma link add siw0 type siw netdev lo
echo "siw-interop: devices: $(ls /sys/class/infiniband | tr '\n' ' ')"

cargo build -q --release -p barewire-drivers --bin barewire-peer
peer=target/release/barewire-peer
if [ "${CAPTURE:-0}" = 1 ]; then
  tshark -i lo -w target/siw-interop.pcap -f "tcp" >/dev/null 2>&1 &
  cap=$!
  sleep 1
fi

run() { # SERVER_DRIVER CLIENT_DRIVER
  local out
  out=$(mktemp)
  BAREWIRE_DRIVER=$1 BAREWIRE_DEVICE=$([ "$1" = verbs ] && echo siw0) timeout 60 "$peer" serve 0 >"$out" &
  local srv=$!
  for _ in $(seq 50); do grep -q READY "$out" && break; sleep 0.1; done
  local port
  port=$(awk '/READY/ {print $2}' "$out")
  echo "== $2 client -> $1 server (port $port)"
  BAREWIRE_DRIVER=$2 BAREWIRE_DEVICE=$([ "$2" = verbs ] && echo siw0) timeout 60 "$peer" check "127.0.0.1:$port"
  kill "$srv" 2>/dev/null || true
  wait "$srv" 2>/dev/null || true
  rm -f "$out"
}

run soft verbs
run verbs soft
if [ "${CAPTURE:-0}" = 1 ]; then
  kill "$cap"; wait "$cap" 2>/dev/null || true
  echo "capture: target/siw-interop.pcap (tshark -r target/siw-interop.pcap -d tcp.port==<port>,iwarp_mpa)"
fi
echo "siw-interop: both directions passed"
