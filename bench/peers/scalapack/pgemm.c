/*
 * The ScaLAPACK side of matmul-bench: C = A.B with p?gemm on a pr x pc BLACS grid (as square
 * as p allows, the same grid barewire's SUMMA uses), n x n matrices in nb x nb blocks, entries
 * in [-1, 1). Rank 0 prints one line:
 *
 *   scalapack n=<n> p=<p> grid=<pr>x<pc> type=<f32|f64> nb=<nb> seconds=<s> gflops=<g>
 *
 * seconds: the p?gemm call alone, between two barriers (best of --reps runs).
 *
 *   mpicc -O2 pgemm.c -o pgemm -lscalapack-openmpi -lblas -lm
 *   mpirun -n 2 ./pgemm 4096 f64 256 3
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern void Cblacs_pinfo(int *me, int *procs);
extern void Cblacs_get(int ctxt, int what, int *val);
extern void Cblacs_gridinit(int *ctxt, const char *order, int rows, int cols);
extern void Cblacs_gridinfo(int ctxt, int *rows, int *cols, int *row, int *col);
extern void Cblacs_gridexit(int ctxt);
extern int numroc_(const int *n, const int *nb, const int *iproc, const int *isrc,
                   const int *nprocs);
extern void descinit_(int *desc, const int *m, const int *n, const int *mb, const int *nb,
                      const int *irsrc, const int *icsrc, const int *ctxt, const int *lld,
                      int *info);
extern void psgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k,
                    const float *alpha, const float *a, const int *ia, const int *ja,
                    const int *desca, const float *b, const int *ib, const int *jb,
                    const int *descb, const float *beta, float *c, const int *ic,
                    const int *jc, const int *descc);
extern void pdgemm_(const char *ta, const char *tb, const int *m, const int *n, const int *k,
                    const double *alpha, const double *a, const int *ia, const int *ja,
                    const int *desca, const double *b, const int *ib, const int *jb,
                    const int *descb, const double *beta, double *c, const int *ic,
                    const int *jc, const int *descc);

static unsigned long long state = 88172645463325252ULL;
static double next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (double)(state >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int n = argc > 1 ? atoi(argv[1]) : 2048;
    int dbl = argc > 2 && strcmp(argv[2], "f64") == 0;
    int nb = argc > 3 ? atoi(argv[3]) : 256;
    int reps = argc > 4 ? atoi(argv[4]) : 3;
    int me, p;
    Cblacs_pinfo(&me, &p);
    int pr = 1;
    for (int d = 1; d * d <= p; d++)
        if (p % d == 0) pr = d;
    int pc = p / pr;
    int ctxt;
    Cblacs_get(-1, 0, &ctxt);
    Cblacs_gridinit(&ctxt, "Row", pr, pc);
    int myr, myc, zero = 0, one = 1, info;
    Cblacs_gridinfo(ctxt, &pr, &pc, &myr, &myc);
    int mloc = numroc_(&n, &nb, &myr, &zero, &pr);
    int nloc = numroc_(&n, &nb, &myc, &zero, &pc);
    int lld = mloc > 1 ? mloc : 1;
    int desc[9];
    descinit_(desc, &n, &n, &nb, &nb, &zero, &zero, &ctxt, &lld, &info);
    size_t len = (size_t)mloc * (size_t)nloc;
    size_t es = dbl ? sizeof(double) : sizeof(float);
    void *a = malloc(len * es), *b = malloc(len * es), *c = malloc(len * es);
    for (size_t i = 0; i < len; i++) {
        if (dbl) {
            ((double *)a)[i] = next();
            ((double *)b)[i] = next();
            ((double *)c)[i] = 0;
        } else {
            ((float *)a)[i] = (float)next();
            ((float *)b)[i] = (float)next();
            ((float *)c)[i] = 0;
        }
    }
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        if (dbl) {
            double al = 1, be = 0;
            pdgemm_("N", "N", &n, &n, &n, &al, a, &one, &one, desc, b, &one, &one, desc, &be,
                    c, &one, &one, desc);
        } else {
            float al = 1, be = 0;
            psgemm_("N", "N", &n, &n, &n, &al, a, &one, &one, desc, b, &one, &one, desc, &be,
                    c, &one, &one, desc);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double t = MPI_Wtime() - t0;
        if (t < best) best = t;
    }
    if (me == 0)
        printf("scalapack n=%d p=%d grid=%dx%d type=%s nb=%d seconds=%.4f gflops=%.2f\n", n, p,
               pr, pc, dbl ? "f64" : "f32", nb, best, 2.0 * n * (double)n * n / best / 1e9);
    free(a);
    free(b);
    free(c);
    Cblacs_gridexit(ctxt);
    MPI_Finalize();
    return 0;
}
