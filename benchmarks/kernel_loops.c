/* The MatVec loops alone, on real input rows: forward and weight gradient of
 * one C x R layer over a block of 256 rows, milliseconds of CPU time (best
 * of 15) and dense-equivalent GMAC/s. Built by bench_kernels.py with
 * -DKERNELS='"file"' naming the kernels' C (templates, one checkout's) and
 * run as: kernel_loops ROWS_FILE R [avx512|avx2|base]. ROWS_FILE holds 256
 * rows of C = 784 doubles (the pixels); gy has about half its values zero
 * (ReLU) and W is fixed, so two checkouts can be compared on the same data. */
#include KERNELS
#include <stdio.h>
#include <time.h>

#define ROWS 256
#define C 784
#define STRIDE 1608         /* doubles from one row to the next, as a block's rows */
#define GY0 800             /* where a row's gy starts */

static double
cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return 1e3 * t.tv_sec + 1e-6 * t.tv_nsec;
}

int
main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    const int R = atoi(argv[2]), RP = (R + 15) & ~15;
    const char *isa = argc > 3 ? argv[3] : "avx512";
    const MatVecKernels *K = strcmp(isa, "avx2") == 0 ? &kernels_avx2
                           : strcmp(isa, "base") == 0 ? &kernels_base : &kernels_avx512;
    double *v = aligned_alloc(64, sizeof(double) * ROWS * STRIDE);
    double *g = aligned_alloc(64, sizeof(double) * ROWS * STRIDE);
    memset(v, 0, sizeof(double) * ROWS * STRIDE);
    memset(g, 0, sizeof(double) * ROWS * STRIDE);
    FILE *f = fopen(argv[1], "rb");
    for (int r = 0; r < ROWS; r++)
        if (!f || fread(v + (size_t)r * STRIDE, sizeof(double), C, f) != C)
            return 3;
    fclose(f);
    unsigned s = 1;
    for (int r = 0; r < ROWS; r++)
        for (int n = 0; n < R; n++) {
            s = s * 1103515245u + 12345u;
            g[(size_t)r * STRIDE + GY0 + n] = (s >> 16) & 1 ? ((int)((s >> 4) % 1000) - 500) * 1e-4 : 0.0;
        }
    double *W = aligned_alloc(64, sizeof(double) * C * RP), *GW = aligned_alloc(64, sizeof(double) * C * RP);
    for (long i = 0; i < (long)C * RP; i++) {
        W[i] = (i % RP) < R ? ((i * 7919) % 1000 - 500) * 1e-5 : 0.0;
        GW[i] = 0.0;
    }
    double *wp = aligned_alloc(64, sizeof(double) * C * (RP + 64));
    double *hp = aligned_alloc(64, sizeof(double) * RP);
    for (int i = 0; i < RP; i++)
        hp[i] = 0.01 * i;
    mv_pack_fwd(W, R, C, RP, wp);
    void *scratch = aligned_alloc(64, 32 << 20);
    const double *xrow[ROWS], *gyrow[ROWS];
    for (int r = 0; r < ROWS; r++) {
        xrow[r] = v + (size_t)r * STRIDE;
        gyrow[r] = g + (size_t)r * STRIDE + GY0;
    }
    const int G = (C + 15) / 16;
    int *groups = malloc(sizeof(int) * G * 16);
    for (int i = 0; i < G * 16; i++)
        groups[i] = i < C ? i : -1;
    int *perm = malloc(sizeof(int) * R);
    for (int j = 0; j < R; j++)
        perm[j] = R - 1 - j;
    double *wq = aligned_alloc(64, sizeof(double) * (C + 64) * RP);
    mv_pack_bgx(W, perm, R, C, RP, wq);
    double fwd = 1e30, bgw = 1e30, bgx = 1e30;
    unsigned long long macs[3] = {0, 0, 0};
    for (int rep = 0; rep < 15; rep++) {
        for (int i = 0; i < 3; i++)
            mv_macs[i] = 0;
        double t = cpu_ms();
        K->bgx(wq, perm, R, C, 1, g + GY0, STRIDE, g, STRIDE, 0, ROWS, scratch);
        t = cpu_ms() - t;
        bgx = t < bgx ? t : bgx;
        t = cpu_ms();
        K->fwd(wp, hp, R, C, 0, 1, v, STRIDE, v + GY0, STRIDE, 0, ROWS, scratch);
        t = cpu_ms() - t;
        fwd = t < fwd ? t : fwd;
        t = cpu_ms();
        K->bgw(R, C, ROWS, xrow, gyrow, GW, RP, groups, 0, G, 0, RP / 16, scratch);
        t = cpu_ms() - t;
        bgw = t < bgw ? t : bgw;
        for (int i = 0; i < 3; i++)
            macs[i] = mv_macs[i];
    }
    const double dense = (double)ROWS * C * R;
    /* a checksum of the outputs: the same data gives the same bits in every checkout */
    double sum = 0;
    for (int r = 0; r < ROWS; r++)
        for (int n = 0; n < R; n++)
            sum += v[(size_t)r * STRIDE + GY0 + n];
    for (long i = 0; i < (long)C * RP; i++)
        sum += GW[i];
    for (int r = 0; r < ROWS; r++)
        for (int k = 0; k < C; k++)
            sum += g[(size_t)r * STRIDE + k];
    /* isa R fwd-ms fwd-dense-GMAC/s bgw-ms bgw-dense-GMAC/s checksum, then the
     * executed (after skipping) GMAC/s of fwd, bgw, and bgx's ms and executed GMAC/s */
    printf("%s\t%d\t%.3f\t%.1f\t%.3f\t%.1f\t%.17g\t%.1f\t%.1f\t%.3f\t%.1f\n", isa, R, fwd, dense / fwd / 1e6, bgw,
           dense / bgw / 1e6, sum, macs[0] / fwd / 1e6, macs[2] / bgw / 1e6, bgx, macs[1] / bgx / 1e6);
    return 0;
}
