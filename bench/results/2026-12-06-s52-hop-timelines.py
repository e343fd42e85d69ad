exec(open(__file__.replace('hop-timelines','hop-trace')).read().split("names=list(parts.keys())")[0])
Bx=ns(parts['B  c send end->s getev start']); A2=ns(parts['A2 c send enter'])
late_s = Bx > np.median(Bx[fast])+500
def show(X, t0, t1, base):
    t,k,arg=X
    i=np.searchsorted(t,t0); j=np.searchsorted(t,t1)
    return " ".join(f"{k[q]}:{arg[q]}@{ns(t[q]-base):.0f}" for q in range(i,min(j+1,len(t))))
import random
random.seed(2)
ids=np.nonzero(late_s)[0]
for r in random.sample(list(ids),6):
    base=ct[c_ss[r]]
    print(f"RT {RT[r]:.0f}; client send enter {ns(ct[c_se[r]]-base):.0f}")
    print("   S:", show(S, ct[c_ss[r]]-1000, st[s_post[r]], base))
