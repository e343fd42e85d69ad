/* 2026-12-06 s53: is this vCPU's speed steady? The same few hundred loads, branches and adds,
 * timed 200,000 times back to back with rdtsc on one CPU, nothing else running in the VM.
 * Prints the p5 and p50 (TSC ticks), the share of samples over 1.4x the p5 ("slow"), and how
 * long slow stretches last (median and p90 of runs of consecutive slow samples, in µs).
 *   gcc -O2 -o /tmp/cpu-speed bench/results/2026-12-06-s53-cpu-speed.c
 *   taskset -c 0 /tmp/cpu-speed 300 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <x86intrin.h>

static int cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  const int n = 200000;
  int work = argc > 1 ? atoi(argv[1]) : 300;
  double ghz = 2.596; /* this host's TSC */
  uint64_t *d = malloc(n * sizeof *d), *s = malloc(n * sizeof *s);
  static uint32_t arr[8192];
  for (int i = 0; i < 8192; i++) arr[i] = i * 2654435761u;
  volatile uint64_t sink;
  for (int i = 0; i < n; i++) {
    uint64_t t0 = __rdtsc(), acc = 0;
    for (int k = 0; k < work; k++) {
      uint32_t v = arr[(k * 97) & 8191];
      acc += (v & 1) ? v >> 3 : v * 3;
    }
    sink = acc;
    d[i] = __rdtsc() - t0;
  }
  memcpy(s, d, n * sizeof *d);
  qsort(s, n, sizeof *s, cmp);
  uint64_t p5 = s[n / 20], p50 = s[n / 2];
  /* runs of slow samples, in µs of wall time */
  double *runs = malloc(n * sizeof *runs);
  int nr = 0, slow = 0;
  double cur = 0;
  for (int i = 0; i < n; i++) {
    int sl = d[i] > 1.4 * p5;
    slow += sl;
    if (sl) cur += d[i] / (ghz * 1e3);
    else if (cur > 0) { runs[nr++] = cur; cur = 0; }
  }
  if (cur > 0) runs[nr++] = cur;
  int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
  qsort(runs, nr, sizeof *runs, cmpd);
  printf("p5 %lu ticks, p50 %lu; slow (over 1.4x p5) %.1f%%; slow stretches: %d, median %.2f us, p90 %.2f us\n",
         p5, p50, 100.0 * slow / n, nr, nr ? runs[nr / 2] : 0, nr ? runs[nr * 9 / 10] : 0);
  (void)sink;
  return 0;
}
