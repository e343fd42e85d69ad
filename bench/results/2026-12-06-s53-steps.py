# 2026-12-06 s53: each side's user-space steps before a fast send enter (under 4.5 us) and a slow one
# (over 4.9 us), medians; reads PREFIX.client and PREFIX.server as hop-trace.py does.
#   python3 bench/results/2026-12-06-s53-steps.py /tmp/s53/b3
import sys, collections, statistics, importlib.util
spec = importlib.util.spec_from_file_location("ht", __import__("os").path.join(__import__("os").path.dirname(__file__), "..", "tools", "hop-trace.py")); ht = importlib.util.module_from_spec(spec); spec.loader.exec_module(ht)
for name in ("client","server"):
    x = ht.Side(sys.argv[1] + "." + name)
    groups = collections.defaultdict(lambda: collections.defaultdict(list))
    for p in x.by[ht.POSTED][100:-5]:
        cs = x.after(ht.ENTER, x.at[p], lambda i: x.arg[i] >> 1 > 0)
        if cs is None: continue
        d = (x.at[cs+1]-x.at[cs])*x.ns
        g = "long" if d > 4900 else ("normal" if d < 4500 else "mid")
        j = cs - 1
        while j > 0 and x.kind[j] != ht.ENTERED: j -= 1
        seq = tuple(x.kind[j:cs+1])
        groups[g][seq].append([(x.at[m+1]-x.at[m])*x.ns for m in range(j, cs)])
    for g in ("normal", "long"):
        seq, rows = max(groups[g].items(), key=lambda kv: len(kv[1]))
        meds = [statistics.median(r[m] for r in rows) for m in range(len(seq)-1)]
        print(name, g, len(rows), "  ".join(f"{ht.NAMES.get(a,a)}->{ht.NAMES.get(b,b)} {m:.0f}" for a,b,m in zip(seq, seq[1:], meds)))
