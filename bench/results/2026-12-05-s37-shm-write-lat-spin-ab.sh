#!/bin/bash
for i in $(seq 1 ${1:-6}); do
 if [ $((i%2)) = 1 ]; then order="base new"; else order="new base"; fi
 for v in $order; do eval "$v=\$(/tmp/bp-$v write_lat --loopback -s 8 -n 20000 --cpu 0,1 --driver shm --json | tail -1 | grep -o '\"t_typical_us\":[0-9.]*' | cut -d: -f2)"; done
 (UCX_TLS=posix,sysv,cma,self taskset -c 1 ucx_perftest -t ucp_put_lat -s 8 -n 20000 >/dev/null 2>&1 &); sleep 0.4
 u=$(UCX_TLS=posix,sysv,cma,self taskset -c 0 ucx_perftest 127.0.0.1 -t ucp_put_lat -s 8 -n 20000 2>&1 | grep Final | awk '{print $3}')
 echo "round $i base $base new $new ucx $u  new/base $(echo "scale=3; $new/$base" | bc) new/ucx $(echo "scale=3; $new/$u" | bc) base/ucx $(echo "scale=3; $base/$u" | bc)"
done
