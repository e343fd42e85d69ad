import sys, numpy as np
GHZ=2.59613
def load(p):
    a=np.fromfile(p,dtype=np.uint64).reshape(-1,2)
    return a[:,0].astype(np.int64),(a[:,1]>>48).astype(np.int64),(a[:,1]&((1<<48)-1)).astype(np.int64)
for p in sys.argv[1:]:
    t,k,arg=load(p)
    # for each ev4 (data rx start), walk back to the look enter end (ev2) and forward to the send enter start (ev1)
    i4=np.nonzero(k==4)[0][1000:-10]
    rows=[]
    for i in i4:
        # back: find previous ev2
        j=i
        while k[j]!=2: j-=1
        seq=[(k[q],t[q]) for q in range(j,i+1)]
        # forward to the next ev1
        q=i+1
        while k[q]!=1: 
            seq.append((k[q],t[q])); q+=1
        seq.append((k[q],t[q]))
        rows.append(seq)
    # canonical sequence: most common kinds tuple
    from collections import Counter
    c=Counter(tuple(x[0] for x in r) for r in rows)
    print(p, "paths:", c.most_common(3))
    best=c.most_common(1)[0][0]
    d=np.array([[ (r[m+1][1]-r[m][1]) for m in range(len(r)-1)] for r in rows if tuple(x[0] for x in r)==best])/GHZ
    names=[f"{best[m]}->{best[m+1]}" for m in range(len(best)-1)]
    print("  ", "  ".join(f"{n}:{v:.0f}" for n,v in zip(names,np.median(d,axis=0))), " total", round(float(np.median(d.sum(axis=1)))))
