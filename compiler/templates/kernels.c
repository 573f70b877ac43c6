/* ---- the loop kernels: what every instruction set shares ------------------ */

/* The loops of kernels_body.c are built once per instruction set, each name
 * with that set's suffix: ISA(fwd_tile) is fwd_tile_avx512 under MV_ISA avx512. */
#define MV_PASTE_(a, b) a##_##b
#define MV_PASTE(a, b) MV_PASTE_(a, b)
#define ISA(name) MV_PASTE(name, MV_ISA)
#define MV_STR_(x) #x
#define MV_STR(x) MV_STR_(x)

static size_t mv_align64(size_t n) { return (n + 63) & ~(size_t)63; }
static int mv_min(int a, int b) { return a < b ? a : b; }
static int mv_max(int a, int b) { return a > b ? a : b; }

/* The multiply-adds the loops ran (terms x lanes that hold outputs, after
 * skipping zeros): forward, input gradient, weight gradient. For the
 * benchmarks (the module's kernel_macs() reads and clears them); counted
 * once per loop call, nothing per term. */
HIDDEN unsigned long long mv_macs[3];
#if defined(__GNUC__) && !defined(__TINYC__)
#define MV_COUNT(kind, n) __atomic_fetch_add(&mv_macs[kind], (unsigned long long)(n), __ATOMIC_RELAXED)
#else
#define MV_COUNT(kind, n) (mv_macs[kind] += (unsigned long long)(n))
#endif

HIDDEN int
mv_all_finite(const double *v, long n)
{
    for (long i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return 0;
    return 1;
}

/* Forward panels from W by column (RP apart): panels of 64 neurons (the
 * last one round8(R) - 64q wide, padded with 0), in each the neurons of
 * one input k side by side: wp[64q*C + k*nw + i] = W[64q + i][k]. Returns
 * whether every weight it copied is finite (the flag that lets the loops
 * skip zeros), so that W is read once. */
HIDDEN int
mv_pack_fwd(const double *wt, int R, int C, int RP, double *wp)
{
    const int R8 = (R + 7) & ~7;
    int finite = 1;
    for (int n0 = 0; n0 < R8; n0 += MV_PW) {
        const int nw = mv_min(MV_PW, R8 - n0), real = mv_min(nw, R - n0);
        double *q = wp + (size_t)n0 * C;
        for (int k = 0; k < C; k++) {
            const double *w = wt + (size_t)k * RP + n0;
            double *out = q + (size_t)k * nw;
            for (int i = 0; i < real; i++) {
                out[i] = w[i];
                finite &= isfinite(w[i]) != 0;
            }
            for (int i = real; i < nw; i++)
                out[i] = 0.0;
        }
    }
    return finite;
}

/* Input-gradient panels: panels of 64 inputs, W's rows in the interpreter's
 * backward order `perm`: wq[64q*R + j*nw + i] = W[perm[j]][64q + i]. W is
 * read by column (a column's rows are near each other in p) for 8 rows of
 * the panel at a time, whose 8 lines are written side by side: 3-4x faster
 * than reading W across its columns for every row. */
HIDDEN void
mv_pack_bgx(const double *wt, const int *perm, int R, int C, int RP, double *wq)
{
    const int C8 = (C + 7) & ~7;
    for (int k0 = 0; k0 < C8; k0 += MV_PW) {
        const int nw = mv_min(MV_PW, C8 - k0), real = mv_min(nw, C - k0);
        double *q = wq + (size_t)k0 * R;
        int j0 = 0;
        for (; j0 + 8 <= R; j0 += 8)
            for (int i = 0; i < real; i++) {
                const double *w = wt + (size_t)(k0 + i) * RP;
                for (int j = j0; j < j0 + 8; j++)
                    q[(size_t)j * nw + i] = w[perm[j]];
            }
        for (int j = j0; j < R; j++)
            for (int i = 0; i < real; i++)
                q[(size_t)j * nw + i] = wt[(size_t)(k0 + i) * RP + perm[j]];
        for (int j = 0; j < R; j++)
            for (int i = real; i < nw; i++)
                q[(size_t)j * nw + i] = 0.0;
    }
}
