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

HIDDEN int
mv_all_finite(const double *v, long n)
{
    for (long i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return 0;
    return 1;
}

/* Forward panels from W by column (RP apart), and the heads padded. */
HIDDEN void
mv_pack_fwd(const double *wt, int R, int C, int RP, double *wp)
{
    for (int q = 0; q < RP / MV_NR; q++)
        for (int k = 0; k < C; k++)
            for (int i = 0; i < MV_NR; i++) {
                const int n = q * MV_NR + i;
                wp[((size_t)q * C + k) * MV_NR + i] = n < R ? wt[(size_t)k * RP + n] : 0.0;
            }
}

/* Input-gradient panels: W's rows in the interpreter's backward order `perm`. */
HIDDEN void
mv_pack_bgx(const double *wt, const int *perm, int R, int C, int RP, double *wq)
{
    const int nq = (C + MV_BGX_NK - 1) / MV_BGX_NK;
    for (int q = 0; q < nq; q++)
        for (int j = 0; j < R; j++)
            for (int i = 0; i < MV_BGX_NK; i++) {
                const int k = q * MV_BGX_NK + i;
                wq[((size_t)q * R + j) * MV_BGX_NK + i] = k < C ? wt[(size_t)k * RP + perm[j]] : 0.0;
            }
}


