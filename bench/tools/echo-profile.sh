#!/usr/bin/env bash
# Profiles the 64-connection TCP echo (echo-bench, both pinned cores: client core 0, server
# core 1) under `perf record -g` for each runtime named, and sorts every sample into where the
# time goes: the kernel's TCP/IP stack (with copies and allocation), io_uring, syscall entry
# and descriptor lookup, epoll, scheduling, other kernel, and user space (runtime, benchmark,
# libc). Prints each runtime's split, each thread's kernel/user share, and the top symbols.
#
#     bench/tools/echo-profile.sh [runtime...]      (default: barewire tokio)
#
# Needs linux-perf (apt-get install linux-perf) and a release build of echo-bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v perf >/dev/null || { echo "perf is missing: apt-get install linux-perf" >&2; exit 1; }
cargo build --release -q -p barewire-bench --bin echo-bench
runtimes=("$@")
[ ${#runtimes[@]} -gt 0 ] || runtimes=(barewire tokio)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for rt in "${runtimes[@]}"; do
    perf record -q -F 1999 -g -o "$tmp/$rt.data" -- \
        target/release/echo-bench run "$rt" --secs 5 2>/dev/null | grep RESULT
    perf report -i "$tmp/$rt.data" --no-children --sort pid,dso --stdio -g none 2>/dev/null \
        | grep -E '^ +[0-9]' | head -6
    perf report -i "$tmp/$rt.data" --no-children --sort dso,sym --stdio -n -g none \
        2>/dev/null > "$tmp/$rt.txt"
    python3 - "$rt" "$tmp/$rt.txt" <<'PY'
import re, sys
rt, path = sys.argv[1], sys.argv[2]
RULES = [
    ("kernel: io_uring", r"io_uring|^io_|__io_|tctx_task_work|task_work"),
    ("kernel: syscall entry, fd lookup", r"do_syscall|syscall|entry_SYSCALL|__x64_sys|fget|fdget|fput|"
     r"security_|__sys_|ksys_|import_|copy_msghdr|sockfd_lookup|__fdget"),
    ("kernel: epoll", r"epoll|ep_|sock_poll|tcp_poll|__pollwait"),
    ("kernel: scheduler, wakeups", r"schedule|switch|finish_task|pick_next|enqueue|dequeue|wake|"
     r"update_curr|ttwu|select_task|hrtimer|tick_|sched"),
    ("kernel: TCP/IP stack, copies, allocation", r"tcp|skb|inet|ip_|__dev|dev_|net_|netif|napi|"
     r"loopback|sock_|sk_|bbr|softirq|copy|csum|neigh|spin_|kmem|slab|kfree|kmalloc|alloc|page|"
     r"local_bh|lock_sock|release_sock|qdisc|pfifo|memcg|mod_|refill|check_|read_tsc|ktime|nf_|"
     r"process_backlog|rcu|dst_"),
]
total, split, top = 0, {}, []
for line in open(path):
    m = re.match(r"\s+([\d.]+)%\s+(\d+)\s+(\S+)\s+\[([k.])\]\s+(.*)", line)
    if not m:
        continue
    n, dso, kind, sym = int(m.group(2)), m.group(3), m.group(4), m.group(5).strip()
    if kind == ".":
        cls = "user: runtime, benchmark, libc"
    else:
        cls = next((c for c, r in RULES if re.search(r, sym)), "kernel: other")
    split[cls] = split.get(cls, 0) + n
    total += n
    top.append((n, kind, sym))
print(f"{rt}: {total} samples")
for c, n in sorted(split.items(), key=lambda x: -x[1]):
    print(f"  {c:42s} {100 * n / total:5.1f}%")
print("  top symbols: " + ", ".join(f"{s[:40]} {100 * n / total:.1f}%" for n, _, s in sorted(top, reverse=True)[:8]))
PY
done
