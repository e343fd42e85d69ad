#!/usr/bin/env bash
# Runs the README's two commands as on a machine with nothing set up: a fresh clone of this
# repository, an empty HOME and CARGO_HOME, and a PATH of the system's directories only (so no
# rustup toolchain: scripts/setup.sh must find or install one itself). Prints how long the tour
# and the test suite took; on a failure, the end of its log.
#
#     bash scripts/fresh-check.sh            # both commands
#     bash scripts/fresh-check.sh --tour     # the main job only
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d /tmp/barewire-fresh.XXXXXX)"
git clone -q "$repo" "$work/barewire"
mkdir -p "$work/home" "$work/cargo-home"
run() { # name, command...
  local name=$1; shift
  local t0=$SECONDS
  if ! env -i HOME="$work/home" CARGO_HOME="$work/cargo-home" \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      TERM="${TERM:-dumb}" CI="${CI:-}" \
      bash -c "cd '$work/barewire' && $*" > "$work/$name.log" 2>&1; then
    echo "fresh-check: '$*' failed after $((SECONDS - t0)) s; the end of $work/$name.log:" >&2
    tail -40 "$work/$name.log" >&2
    exit 1
  fi
  echo "fresh-check: $name ('$*'): $((SECONDS - t0)) s"
}
run tour "bash scripts/demo.sh"
toolchain=$(env -i HOME="$work/home" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin rustc --version)
echo "fresh-check: toolchain used: $toolchain"
if [ "${1:-}" != "--tour" ]; then
  run tests "bash scripts/test.sh"
fi
rm -rf "$work"
echo "fresh-check: passed"
