// The floor under `Channel<[u8; 64]>` over shm (bench/RESULTS.md, twenty-eighth session): a bare
// single-producer ring between two pinned threads, with the channel's 72-byte slots (a length
// word, a mark word, 64 bytes of message) and credits returned every 256 messages, and no library
// code. Prints messages per second.
//
//     gcc -O2 -pthread -o /tmp/bare-ring bench/tools/bare-ring.c
//     /tmp/bare-ring [SLOTS [MESSAGES]]      (defaults: 1024 slots, 30,000,000 messages)
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define SLOT 72
static long N = 1024, M = 30000000;
static unsigned char *ring;
static _Alignas(64) _Atomic uint64_t consumed;
static _Alignas(64) volatile uint64_t sink;
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static void *cons(void *a){ pin(1); unsigned char buf[64]; uint64_t acc=0;
  for (long i=0;i<M;i++){ _Atomic uint32_t *mark=(_Atomic uint32_t*)(ring+(i%N)*SLOT+4);
    while (atomic_load_explicit(mark,memory_order_acquire)!=(uint32_t)(i+1)) ;
    memcpy(buf, ring+(i%N)*SLOT+8, 64); acc+=buf[0];
    if ((i+1)%256==0) atomic_store_explicit(&consumed,i+1,memory_order_release); }
  sink=acc; return 0; }
int main(int c,char**v){ if(c>1)N=atol(v[1]); if(c>2)M=atol(v[2]); ring=aligned_alloc(4096,((N*SLOT+4095)/4096)*4096); memset(ring,0,N*SLOT);
  pthread_t t; pthread_create(&t,0,cons,0); pin(0); unsigned char msg[64]; memset(msg,7,64);
  struct timespec a,b; clock_gettime(CLOCK_MONOTONIC,&a); uint64_t cr=0;
  for (long i=0;i<M;i++){ while (i-cr>=N) cr=atomic_load_explicit(&consumed,memory_order_acquire);
    unsigned char *s=ring+(i%N)*SLOT; *(uint32_t*)s=64; memcpy(s+8,msg,64);
    atomic_store_explicit((_Atomic uint32_t*)(s+4),(uint32_t)(i+1),memory_order_release); }
  pthread_join(t,0); clock_gettime(CLOCK_MONOTONIC,&b);
  double s=(b.tv_sec-a.tv_sec)+(b.tv_nsec-a.tv_nsec)/1e9; printf("N=%ld %.1f M msg/s\n",N,M/s/1e6); }
