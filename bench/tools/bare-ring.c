// The floor under `Channel<[u8; 64]>` over shm (bench/RESULTS.md, twenty-eighth and
// forty-second sessions): a bare single-producer ring between two pinned threads, with the
// channel's 72-byte slots (a length word, 64 bytes of message, a mark word), credits returned
// every 256 messages, and no library code. Prints messages per second.
//
// The receiver copies each message out and clears its slot's length and mark, as the channel's
// does. With RUN = 1 each message is stored straight into its slot, its mark last. With RUN > 1
// the sender writes RUN messages, then publishes them together:
// - PUBLISH = 0: into a staging buffer of its own, then copied into the ring in one ascending
//   pass (the shm driver's ordered copy; the channel's bursts until the forty-fifth session);
// - PUBLISH = 1: each message and its mark straight into its slot with the length word left
//   unpublished (top bit clear), then the run's length words, the last first (the channel's
//   bursts over shm since the forty-fifth session).
// (The twenty-eighth session's version had marks that counted laps, and no clearing.)
//
//     gcc -O2 -pthread -o /tmp/bare-ring bench/tools/bare-ring.c
//     /tmp/bare-ring [SLOTS [MESSAGES [RUN [PUBLISH]]]]  (defaults: 1024, 30,000,000, 1, 0)
//     /tmp/bare-ring 1024 30000000 512 1                 (the channel's halves at 1,024 slots)
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
#define MARK 0x5ab17e0du
static long N = 1024, M = 30000000, RUN = 1, PUBLISH = 0;
static unsigned char *ring;
static _Alignas(64) _Atomic uint64_t consumed;
static _Alignas(64) volatile uint64_t sink;
static void pin(int c) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(c, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}
static uint32_t load(unsigned char *p) {
  return atomic_load_explicit((_Atomic uint32_t *)p, memory_order_acquire);
}
static void *receiver(void *a) {
  (void)a;
  pin(1);
  unsigned char buf[64];
  uint64_t acc = 0;
  for (long i = 0; i < M; i++) {
    unsigned char *s = ring + (i % N) * SLOT;
    while (!(load(s) & 1u << 31) || load(s + 68) != MARK)
      ;
    memcpy(buf, s + 4, 64);
    acc += buf[0];
    // Cleared, so that the next lap's mark is new (as the channel's receiver does).
    atomic_store_explicit((_Atomic uint32_t *)s, 0, memory_order_relaxed);
    atomic_store_explicit((_Atomic uint32_t *)(s + 68), 0, memory_order_relaxed);
    if ((i + 1) % 256 == 0)
      atomic_store_explicit(&consumed, i + 1, memory_order_release);
  }
  sink = acc;
  return 0;
}
// A message: its length (top bit set, as the channel's), its bytes, the mark.
static void compose(unsigned char *s, const unsigned char *msg) {
  uint32_t len = 64 | 1u << 31, mark = MARK;
  memcpy(s, &len, 4);
  memcpy(s + 4, msg, 64);
  memcpy(s + 68, &mark, 4);
}
// 16 bytes at a time, in ascending order (x86 keeps stores in program order; the barrier keeps
// the compiler from merging or reordering them), as the shm driver copies a watched Write.
static void copy_ascending(unsigned char *d, const unsigned char *s, long n) {
  for (long o = 0; o < n; o += 16) {
    __uint128_t v;
    memcpy(&v, s + o, 16);
    memcpy(d + o, &v, 16);
    __asm__ volatile("" ::: "memory");
  }
}
int main(int c, char **v) {
  if (c > 1) N = atol(v[1]);
  if (c > 2) M = atol(v[2]);
  if (c > 3) RUN = atol(v[3]);
  if (c > 4) PUBLISH = atol(v[4]);
  if (RUN < 1 || RUN > N) RUN = 1;
  ring = aligned_alloc(4096, ((N * SLOT + 4095) / 4096) * 4096);
  memset(ring, 0, N * SLOT);
  unsigned char *staging = aligned_alloc(4096, ((RUN * SLOT + 4095) / 4096) * 4096);
  pthread_t t;
  pthread_create(&t, 0, receiver, 0);
  pin(0);
  unsigned char msg[64];
  memset(msg, 7, 64);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  uint64_t credit = 0;
  for (long i = 0; i < M;) {
    long r = RUN, at = i % N;
    if (r > M - i) r = M - i;
    if (at + r > N) r = N - at; // a run stops at the ring's end
    while ((uint64_t)(i + r) - credit > (uint64_t)N)
      credit = atomic_load_explicit(&consumed, memory_order_acquire);
    if (RUN == 1) {
      unsigned char *s = ring + at * SLOT;
      uint32_t len = 64 | 1u << 31;
      memcpy(s, &len, 4);
      memcpy(s + 4, msg, 64);
      atomic_store_explicit((_Atomic uint32_t *)(s + 68), MARK, memory_order_release);
    } else if (PUBLISH) {
      unsigned char *run = ring + at * SLOT;
      uint32_t len = 64, mark = MARK;
      for (long k = 0; k < r; k++) {
        memcpy(run + k * SLOT, &len, 4);
        memcpy(run + k * SLOT + 4, msg, 64);
        memcpy(run + k * SLOT + 68, &mark, 4);
      }
      for (long k = r - 1; k >= 0; k--)
        atomic_store_explicit((_Atomic uint32_t *)(run + k * SLOT), len | 1u << 31,
                              memory_order_release);
    } else {
      for (long k = 0; k < r; k++)
        compose(staging + k * SLOT, msg);
      copy_ascending(ring + at * SLOT, staging, r * SLOT);
    }
    i += r;
  }
  pthread_join(t, 0);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double s = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9;
  printf("N=%ld RUN=%ld PUBLISH=%ld %.1f M msg/s\n", N, RUN, PUBLISH, M / s / 1e6);
}
