import sys, struct, numpy as np, bisect
GHZ=2.59613
def load(p):
    a=np.fromfile(p,dtype=np.uint64).reshape(-1,2)
    t=a[:,0].astype(np.int64); k=(a[:,1]>>48).astype(np.int64); arg=(a[:,1]&((1<<48)-1)).astype(np.int64)
    return t,k,arg
cp,sp=sys.argv[1],sys.argv[2]
C=load(cp); S=load(sp)
def idx(X,kind): return np.nonzero(X[1]==kind)[0]
def nxt(X,ts,kind,cond=None):
    # index of first event of kind at time >= ts
    t,k,arg=X
    sel=np.nonzero(k==kind)[0]
    if cond is not None: sel=sel[cond(arg[sel])]
    tt=t[sel]; j=np.searchsorted(tt,ts,side='left'); 
    j=np.minimum(j,len(sel)-1); return sel[j]
def prv(X,ts,kind,cond=None):
    t,k,arg=X
    sel=np.nonzero(k==kind)[0]
    if cond is not None: sel=sel[cond(arg[sel])]
    tt=t[sel]; j=np.searchsorted(tt,ts,side='right')-1
    return sel[np.maximum(j,0)]
ct,ck,ca=C; st,sk,sa=S
cpost=idx(C,6)
cpost=cpost[1000:-10]
tp=ct[cpost]
c_ss=nxt(C,tp,1,lambda a:(a>>8)>0); c_se=c_ss+1
assert (ck[c_se]==2).all()
s4=nxt(S,tp,4); s5=s4+1
s_gs=prv(S,st[s4],1)
s_post=nxt(S,st[s4],6)
s_ss=nxt(S,st[s_post],1,lambda a:(a>>8)>0); s_se=s_ss+1
c4=nxt(C,st[s_post],4); c5=c4+1
c_gs=prv(C,ct[c4],1)
ns=lambda x: x/GHZ
RT=ns(ct[c5]-tp)
parts={
 'A1 c post->send enter':ct[c_ss]-tp,
 'A2 c send enter':ct[c_se]-ct[c_ss],
 'B  c send end->s getev start':st[s_gs]-ct[c_se],
 'C  s getev start->rx':st[s4]-st[s_gs],
 'D  s rx->post':st[s_post]-st[s4],
 'E  s post->send enter':st[s_ss]-st[s_post],
 'F  s send enter':st[s_se]-st[s_ss],
 'G  s send end->c getev start':ct[c_gs]-st[s_se],
 'H  c getev start->rx done':ct[c5]-ct[c_gs],
}
p50=np.median(RT)
print("n",len(RT),"RT p50 ns",round(p50),"p90",round(np.percentile(RT,90)),"p99",round(np.percentile(RT,99)))
h,e=np.histogram(RT,bins=np.arange(p50-1000,p50+4000,250))
for a,b in zip(e,h): print(f"{a:6.0f} {b:6d}")
fast=(RT<p50+400)&(RT>p50-400); slow=(RT>p50+700)&(RT<p50+1500); slow2=(RT>p50+1500)&(RT<p50+2600)
print("fast",fast.sum(),"slow(+0.7..1.5us)",slow.sum(),"slow2",slow2.sum())
for name,v in parts.items():
    v=ns(v)
    print(f"{name:34s} fast {np.median(v[fast]):8.0f}  slow {np.median(v[slow]):8.0f}  slow2 {np.median(v[slow2]) if slow2.sum() else 0:8.0f}")
# number of getevents enters per side in window
names=list(parts.keys())
M=np.array([ns(parts[n]) for n in names])  # parts x RT
med=np.median(M[:,fast],axis=1)
ex=M-med[:,None]
for lab,sel in (('slow',slow),('slow2',slow2)):
    am=np.argmax(ex[:,sel],axis=0)
    print(lab, "part carrying most excess:", {names[i].split()[0]:int((am==i).sum()) for i in range(len(names))})
    print(lab, "mean excess per part:", {names[i].split()[0]:round(float(ex[i,sel].mean())) for i in range(len(names))})
def show(X, t0, t1, base):
    t,k,arg=X
    i=np.searchsorted(t,t0); j=np.searchsorted(t,t1)
    out=[]
    for q in range(i,j+1):
        if q>=len(t): break
        out.append(f"{k[q]}:{arg[q]}@{ns(t[q]-base):.0f}")
    return " ".join(out)
import random
random.seed(1)
for lab,sel in (('fast',fast),('slow',slow)):
    ids=np.nonzero(sel)[0]
    for r in random.sample(list(ids),5):
        base=ct[c_ss[r]]
        print(lab, f"RT {RT[r]:.0f}; client send enter {ns(ct[c_se[r]]-base):.0f}")
        print("   S:", show(S, ct[c_ss[r]]-3000, st[s_post[r]], base))
Bx=ns(parts['B  c send end->s getev start']); A2=ns(parts['A2 c send enter'])
Gx=ns(parts['G  s send end->c getev start']); F=ns(parts['F  s send enter'])
late_s = Bx > np.median(Bx[fast])+500
late_c = Gx > np.median(Gx[fast])+500
print("server look late:",late_s.sum(),"A2 median when late",np.median(A2[late_s]),"else",np.median(A2[~late_s]))
print("client look late:",late_c.sum(),"F median when late",np.median(F[late_c]),"else",np.median(F[~late_c]))
print("RT median when server late",np.median(RT[late_s]),"client late",np.median(RT[late_c]),"neither",np.median(RT[~late_s&~late_c]))
