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

# The Rust toolchain. The minimum version is the workspace's `rust-version` (Cargo.toml), and
# the first of these that is new enough is used:
#   1. a toolchain already on PATH, or in ~/.cargo/bin (rustup's);
#   2. on Debian 12, Debian's rustc-web and cargo-web (newer than its rustc; /usr/bin/rustc);
#   3. the distribution's rustc and cargo (new enough from Debian 13 on);
#   4. otherwise an error that names both ways out.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUST_MIN=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' "$here/Cargo.toml" | head -1)
[ -n "$RUST_MIN" ] || { echo "barewire setup: no rust-version in $here/Cargo.toml" >&2; exit 1; }

# True when rustc and cargo on PATH exist and rustc is at least RUST_MIN.
rust_ok() {
  command -v cargo >/dev/null && command -v rustc >/dev/null || return 1
  local v
  v=$(rustc --version 2>/dev/null | awk '{print $2}')
  [ -n "$v" ] && [ "$(printf '%s\n%s\n' "$v" "$RUST_MIN" | sort -V | head -1)" = "$RUST_MIN" ]
}

apt_candidate() {
  apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}' | grep -v '(none)' | sed 's/[+~-].*//'
}

if ! rust_ok && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! rust_ok; then
  need_root apt-get update -qq
  if [ -n "$(apt_candidate rustc-web)" ]; then
    echo "barewire setup: installing Debian's rustc-web and cargo-web ($(apt_candidate rustc-web); barewire needs Rust $RUST_MIN or newer)"
    need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustc-web cargo-web >/dev/null
  fi
fi
if ! rust_ok; then
  cand=$(apt_candidate rustc)
  if [ -n "$cand" ] && [ "$(printf '%s\n%s\n' "$cand" "$RUST_MIN" | sort -V | head -1)" = "$RUST_MIN" ]; then
    echo "barewire setup: installing the distribution's rustc and cargo ($cand)"
    need_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rustc cargo >/dev/null
  fi
fi
if ! rust_ok; then
  have=$(rustc --version 2>/dev/null || echo "no rustc")
  echo "barewire setup: barewire needs Rust $RUST_MIN or newer ($have here). Either install a" \
    "toolchain with rustup (it lands in ~/.cargo/bin, which this script looks in), or on" \
    "Debian 12 enable the bookworm (or bookworm-security) suite and run:" \
    "apt-get install rustc-web cargo-web" >&2
  exit 1
fi
