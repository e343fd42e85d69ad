import sys, numpy as np
GHZ=2.59613
for p in sys.argv[1:]:
    a=np.fromfile(p,dtype=np.uint64).reshape(-1,2)
    t=a[:,0].astype(np.int64); k=(a[:,1]>>48).astype(np.int64)
    starts=np.nonzero(k==1)[0]
    n_long_eagain=0; n_long_data=0; n_data=0
    durs_e=[]
    for j,i in enumerate(starts[:-1]):
        e=i+1
        assert k[e]==2
        nxt=starts[j+1]
        seg=k[e:nxt]
        data=(seg==4).any()
        # skip send enters: the floor's send enter is preceded by ev6; bw's post_send ev6 precedes its send enter
        if i>0 and k[i-1]==6: continue
        d=(t[e]-t[i])/GHZ
        if data:
            n_data+=1
            if d>1200: n_long_data+=1
        elif d>1200:
            n_long_eagain+=1
    print(p, "messages", n_data, "long looks with data", n_long_data, f"({n_long_data/n_data:.1%})", "long looks that found nothing", n_long_eagain, f"({n_long_eagain/n_data:.1%})")
