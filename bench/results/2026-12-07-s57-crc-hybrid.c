#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>
// per iteration: 128 B vector (4 ymm) + S scalar streams x W words
#ifndef W
#define W 2
#endif
__attribute__((target("avx2,vpclmulqdq,sse4.2")))
static uint64_t hyb(const uint8_t *s, size_t n, __m256i *out){
  __m256i k=_mm256_set_epi64x(3,4,3,4);
  size_t per=128+3*8*W; size_t it=n/per;
  const uint8_t *v=s, *c0=s+it*128, *c1=c0+it*8*W, *c2=c1+it*8*W;
  __m256i a=_mm256_loadu_si256((void*)v),b=_mm256_loadu_si256((void*)(v+32)),c=_mm256_loadu_si256((void*)(v+64)),d=_mm256_loadu_si256((void*)(v+96));
  uint64_t r0=0,r1=0,r2=0;
  for(size_t i=1;i<it;i++){ const uint8_t*p=v+i*128;
    a=_mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(a,k,0),_mm256_clmulepi64_epi128(a,k,0x11)),_mm256_loadu_si256((void*)(p)));
    b=_mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(b,k,0),_mm256_clmulepi64_epi128(b,k,0x11)),_mm256_loadu_si256((void*)(p+32)));
    c=_mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(c,k,0),_mm256_clmulepi64_epi128(c,k,0x11)),_mm256_loadu_si256((void*)(p+64)));
    d=_mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(d,k,0),_mm256_clmulepi64_epi128(d,k,0x11)),_mm256_loadu_si256((void*)(p+96)));
    for(int w=0;w<W;w++){ uint64_t x0,x1,x2; memcpy(&x0,c0+(i*W+w)*8,8);memcpy(&x1,c1+(i*W+w)*8,8);memcpy(&x2,c2+(i*W+w)*8,8);
      r0=_mm_crc32_u64(r0,x0); r1=_mm_crc32_u64(r1,x1); r2=_mm_crc32_u64(r2,x2);}
  }
  out[0]=_mm256_xor_si256(_mm256_xor_si256(a,b),_mm256_xor_si256(c,d));
  return r0^r1^r2;
}
int main(int argc,char**argv){ size_t n=atoi(argv[1]); uint8_t*s=aligned_alloc(4096,n); memset(s,3,n); __m256i o; uint64_t z=0;
 size_t reps=(1<<30)/n; for(int r=0;r<3;r++){ uint64_t t0=__rdtsc(); for(size_t i=0;i<reps;i++) z+=hyb(s,n,&o); uint64_t t1=__rdtsc();
 printf("W=%d n=%zu %.4f ticks/B\n",W,n,(t1-t0)/(double)(reps*n));} return (int)z&((int*)&o)[0]&1;}
