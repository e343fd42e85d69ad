#!/usr/bin/env bash
# Installs what barewire needs on Debian 12 and is not there yet. Sourced by the README's two
# commands; safe to run again (it only installs what is missing).
set -euo pipefail

APT_PACKAGES=(build-essential pkg-config libclang-dev librdmacm-dev libibverbs-dev tshark iproute2 fonts-dejavu-core slurm-client slurmctld slurmd openmpi-bin libopenblas0)

need_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "barewire setup: need root (or sudo) to run: $*" >&2; exit 1; fi
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "barewire setup: installing ${missing[*]}"
  need_root apt-get update -qq
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null; then
  echo "barewire setup: cargo not found; installing Debian's rustc and cargo (barewire needs Rust 1.80 or newer)"
  need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cargo rustc >/dev/null
fi
v=$(rustc --version | awk '{print $2}')
if [ "$(printf '%s\n1.80.0\n' "$v" | sort -V | head -1)" != "1.80.0" ]; then
  echo "barewire setup: rustc $v is older than 1.80; install a newer toolchain with rustup" >&2
  exit 1
fi
