#!/usr/bin/env python3
"""Where a write_lat round trip's time goes, from both sides' engine timelines.

    cargo build --release -p barewire-bench --features trace
    target/release/barewire-perf write_lat --loopback -s 8 -n 50000 --cpu 0,1 --trace /tmp/t
    python3 bench/tools/hop-trace.py /tmp/t

reads /tmp/t.client and /tmp/t.server (the format is in engine/src/trace.rs) and prints:
- each round trip cut into parts (the client's post to its send's enter, that enter, the
  server's look catching the bytes, its handling, its send, and back), medians over the round
  trips within 0.4 us of the p50;
- each side's steps from the return of the enter that brought the bytes to the enter of the
  answer's send;
- looks (enters of one entry that are not a send) that ran over 1.2 us and found nothing, per
  message (bench/RESULTS.md, fifty-second session), and, since a CPU in a slow state makes
  ordinary looks that long too (fifty-third session), looks that were in the kernel when the
  peer's send returned and found nothing, the next look taking the bytes: the socket backlog
  race, or a look that checked just before the segment came;
- each side's send enters split in two: within 0.6 us of their p10, and slower; the share of
  slow ones, and the user-space path before each kind (from the return of the enter that
  brought the bytes to the send's enter). On this project's host both move together: the
  whole CPU runs slower at times (bench/RESULTS.md, fifty-third session).

A run of `tcp-floor --trace PREFIX` (the bare floor, same build feature) reads the same way.
Plain Python, no packages.
"""
import bisect
import statistics
import struct
import sys

ENTER, ENTERED, REAPED, RECEIVED, PLACED, POSTED, SAW_BYTE = 1, 2, 3, 4, 5, 6, 0x101
NAMES = {ENTER: "enter", ENTERED: "entered", REAPED: "reaped", RECEIVED: "received",
         PLACED: "placed", POSTED: "posted", SAW_BYTE: "saw byte"}


def load(path):
    data = open(path, "rb").read()
    words = struct.unpack(f"<{len(data) // 8}Q", data)
    rate = words[0]
    at = list(words[2::2])
    kind = [w >> 48 for w in words[3::2]]
    arg = [w & ((1 << 48) - 1) for w in words[3::2]]
    return rate, at, kind, arg


class Side:
    def __init__(self, path):
        self.rate, self.at, self.kind, self.arg = load(path)
        self.ns = 1e9 / self.rate
        self.by = {}
        for i, k in enumerate(self.kind):
            self.by.setdefault(k, []).append(i)

    def after(self, kind, t, pred=None):
        """Index of the first event of `kind` at or after clock `t` (optionally matching)."""
        idx = self.by.get(kind, [])
        j = bisect.bisect_left(idx, t, key=self.at.__getitem__)
        while j < len(idx) and pred is not None and not pred(idx[j]):
            j += 1
        return idx[j] if j < len(idx) else None

    def before(self, kind, t):
        """Index of the last event of `kind` at or before clock `t`."""
        idx = self.by.get(kind, [])
        j = bisect.bisect_right(idx, t, key=self.at.__getitem__) - 1
        return idx[j] if j >= 0 else None


def median(v):
    return statistics.median(v) if v else float("nan")


def round_trips(c, s):
    parts = []
    sending = lambda side: (lambda i: side.arg[i] >> 1 > 0)
    posts = c.by.get(POSTED, [])
    for p in posts[len(posts) // 50: -5]:
        t0 = c.at[p]
        cs = c.after(ENTER, t0, sending(c))
        s_rx = s.after(RECEIVED, t0)
        if cs is None or s_rx is None:
            continue
        s_look = s.before(ENTER, s.at[s_rx])
        s_post = s.after(POSTED, s.at[s_rx])
        if s_post is None:
            continue
        ss = s.after(ENTER, s.at[s_post], sending(s))
        c_rx = c.after(RECEIVED, s.at[s_post])
        if ss is None or c_rx is None:
            continue
        c_look = c.before(ENTER, c.at[c_rx])
        c_saw = c.after(SAW_BYTE, c.at[c_rx])
        if c_saw is None or c.at[c_saw] - t0 > 1000 * c.rate / 1e6:
            continue
        # The two clocks are one TSC (the same machine); nanoseconds per side.
        parts.append({
            "client: post -> its send's enter": (c.at[cs] - t0) * c.ns,
            "client's send enter": (c.at[cs + 1] - c.at[cs]) * c.ns,
            "-> server's bytes in user space": (s.at[s_rx] - c.at[cs + 1]) * c.ns,
            "server: bytes -> post": (s.at[s_post] - s.at[s_rx]) * s.ns,
            "server: post -> its send's enter": (s.at[ss] - s.at[s_post]) * s.ns,
            "server's send enter": (s.at[ss + 1] - s.at[ss]) * s.ns,
            "-> client's bytes in user space": (c.at[c_rx] - s.at[ss + 1]) * c.ns,
            "(server's catching look began, before the client's send returned)":
                (c.at[cs + 1] - s.at[s_look]) * c.ns if s_look is not None else float("nan"),
            "round trip": (c.at[c_saw] - t0) * c.ns,
        })
    return parts


def user_steps(side):
    """From the enter whose look brought bytes to the enter of the answer's send."""
    rows = {}
    for rx in side.by.get(RECEIVED, []):
        j = rx
        while j > 0 and side.kind[j] != ENTERED:
            j -= 1
        k, posted = rx, False
        while k + 1 < len(side.kind):
            k += 1
            if side.kind[k] == POSTED:
                posted = True
            elif side.kind[k] == ENTER and posted:
                break
        else:
            continue
        seq = tuple(side.kind[j:k + 1])
        rows.setdefault(seq, []).append([(side.at[m + 1] - side.at[m]) * side.ns
                                         for m in range(j, k)])
    if not rows:
        return None
    seq, steps = max(rows.items(), key=lambda kv: len(kv[1]))
    meds = [median([r[m] for r in steps]) for m in range(len(seq) - 1)]
    return seq, meds, len(steps), median([sum(r) for r in steps])


def blocked_looks(side, over_ns=1200):
    enters = side.by.get(ENTER, [])
    found = nothing = 0
    for n, i in enumerate(enters):
        if side.arg[i] >> 1 != 1 or (i > 0 and side.kind[i - 1] == POSTED):
            continue  # not a look: a send, or a submission of several entries
        end = enters[n + 1] if n + 1 < len(enters) else len(side.kind)
        took = any(side.kind[m] == RECEIVED for m in range(i, end))
        long = (side.at[i + 1] - side.at[i]) * side.ns > over_ns
        found += took
        nothing += long and not took
    return found, nothing


def sends(side):
    """Each send of `side`: the index of its enter (the first enter after its post)."""
    for p in side.by.get(POSTED, []):
        send = side.after(ENTER, side.at[p])
        if send is not None and send + 1 < len(side.kind):
            yield p, send


def raced_looks(rx, tx):
    """Of `tx`'s sends, how many `rx` missed with a look that was in the kernel when the send's
    enter returned (the segment had been delivered by then) and found nothing, the next look
    taking the bytes: the backlog race's signature, whatever the CPU's speed. (A look over a
    fixed 1.2 us also counts ordinary looks of a CPU in a slow state.)"""
    count = raced = 0
    for _, send in sends(tx):
        ret = tx.at[send + 1]
        look = rx.before(ENTER, ret)
        got = rx.after(RECEIVED, ret)
        if look is None or got is None or look + 1 >= len(rx.kind):
            continue
        count += 1
        # In the kernel at `ret`, back with nothing, and the bytes taken by the very next look.
        if rx.at[look + 1] > ret and rx.kind[look + 1] == ENTERED:
            nxt = rx.after(ENTER, rx.at[look + 1])
            if nxt is not None and nxt < got and rx.before(ENTER, rx.at[got]) == nxt:
                raced += 1
    return count, raced


def send_modes(side, slower_ns=600):
    """Send enters within `slower_ns` of their p10 and slower ones: (p10, share slower,
    median user path before a fast one, before a slow one)."""
    rows = []
    for p, send in sends(side):
        bytes_in = side.before(RECEIVED, side.at[p])
        look_end = side.before(ENTERED, side.at[bytes_in]) if bytes_in is not None else None
        if look_end is None:
            continue
        rows.append(((side.at[send + 1] - side.at[send]) * side.ns,
                     (side.at[send] - side.at[look_end]) * side.ns))
    if not rows:
        return None
    enters = sorted(d for d, _ in rows)
    p10 = enters[len(enters) // 10]
    slow = [u for d, u in rows if d > p10 + slower_ns]
    fast = [u for d, u in rows if d <= p10 + slower_ns]
    return p10, len(slow) / len(rows), median(fast), median(slow)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    c, s = Side(sys.argv[1] + ".client"), Side(sys.argv[1] + ".server")
    rts = round_trips(c, s)
    if not rts:
        sys.exit("no round trips found (a write_lat run with --trace on both sides?)")
    rt = sorted(r["round trip"] for r in rts)
    p = lambda q: rt[min(len(rt) - 1, int(q * len(rt)))]
    print(f"{len(rt)} round trips: p50 {p(0.5):.0f} ns, p90 {p(0.9):.0f}, p99 {p(0.99):.0f}")
    near = [r for r in rts if abs(r["round trip"] - p(0.5)) < 400]
    print(f"parts, medians over the {len(near)} within 0.4 us of the p50 (ns):")
    for name in rts[0]:
        print(f"  {name:68s} {median([r[name] for r in near]):7.0f}")
    for label, side in (("client", c), ("server", s)):
        u = user_steps(side)
        if u:
            seq, meds, n, total = u
            steps = "  ".join(f"{NAMES.get(a, a)}->{NAMES.get(b, b)} {m:.0f}"
                              for a, b, m in zip(seq, seq[1:], meds))
            print(f"{label}: bytes' enter return -> answer's enter, {n} messages, median "
                  f"{total:.0f} ns:\n  {steps}")
        found, nothing = blocked_looks(side)
        if found:
            print(f"{label}: looks over 1.2 us that found nothing: {nothing} "
                  f"({nothing / found:.1%} of {found} messages)")
        count, raced = raced_looks(side, s if side is c else c)
        if count:
            print(f"{label}: looks in the kernel as the peer's send returned that found nothing, "
                  f"the next look taking the bytes: {raced / count:.1%} of {count} messages")
        m = send_modes(side)
        if m:
            p10, share, fast, slow = m
            print(f"{label}: send enters: p10 {p10:.0f} ns, {share:.1%} over p10 + 0.6 us; "
                  f"bytes' enter return -> send's enter {fast:.0f} ns before the others, "
                  f"{slow:.0f} before those")


if __name__ == "__main__":
    main()
