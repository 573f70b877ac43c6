/* ---- exact loop kernels of the MatVec ops: what every instruction set shares ----
 *
 * A MatVec is y[n] = h[n] + W[n][0]*x[0] + ... + W[n][C-1]*x[C-1] for n < R,
 * for every input row, each output ONE running sum whose terms are added in
 * the interpreter's order: acc = acc + (w*x), the product rounded, then the
 * sum rounded; no FMA (see the floating-point contract at the top of the
 * module), no reassociation, no partial sums. Speed comes only from working
 * on many independent sums at once: register tiles of 8 rows x 16 neurons
 * (forward), 8 rows x 16 inputs (input gradient) and 16 inputs x 16 neurons
 * (weight gradient), over weights packed into 64-byte-aligned panels
 * (kernels_body.c holds the loops, built once per instruction set).
 *
 * Zero skipping: a term w * 0 with w finite is a signed zero, and adding a
 * signed zero to a running sum leaves it unchanged unless the sum is -0.0;
 * a sum that does not start at -0.0 never becomes -0.0 (in round-to-nearest,
 * only -0 + -0 is -0). So a term whose x (or gradient) is zero is left out
 * while the other factor is finite and the sum did not start at -0.0; a tile
 * leaves out a column only when all its rows are zero there. Non-finite data
 * is never skipped, so it gives the interpreter's bits too.
 *
 * Layouts (rows of a block are ROW_STRIDE doubles apart):
 *   x of row r          v + r*ld + x0 + k
 *   y of row r          v + r*ld + y0 + n, with room for round16(R) values
 *   W                   the parameters, by column: W[n][k] = p[w0 + k*RP + n],
 *                       RP = round16(R) (the padding stays 0)
 *   gradient of W       gp[w0 + k*RP + n], the same layout
 *   forward panels      wp[(q*C + k)*16 + i] = W[16q + i][k]  (aux)
 *   heads, padded       hp[n]                                 (aux)
 *   input-grad panels   wq[(q*R + j)*16 + i] = W[perm[j]][16q + i]   (aux)
 */

#define MV_NR 16          /* neurons per forward panel and weight-gradient tile */
#define MV_FWD_MR 8       /* rows per forward register tile */
#define MV_BGX_NK 16      /* inputs per input-gradient panel */
#define MV_BGX_MR 8       /* rows per input-gradient register tile */
#define MV_BGW_MK 16      /* inputs per weight-gradient tile: they share one list of rows */

static int mv_round16(int n) { return (n + 15) & ~15; }
static size_t mv_align64(size_t n) { return (n + 63) & ~(size_t)63; }
static int mv_min(int a, int b) { return a < b ? a : b; }

/* scratch bytes one thread needs for a MatVec of R x C over `rows` virtual
 * rows (rows x uses), `groups` weight-gradient groups */
static size_t
mv_scratch_bytes(int R, int C, int rows, int groups)
{
    size_t fwd = sizeof(int) * (size_t)(C + 16) + 128;
    size_t bgx = mv_align64(sizeof(int) * (R + 16)) + sizeof(double) * (size_t)R * MV_BGX_MR + 128;
    size_t bgw = mv_align64(sizeof(int) * (size_t)groups * (rows + 1))
                 + sizeof(double) * (size_t)groups * rows * MV_BGW_MK + (size_t)rows + 256;
    size_t m = fwd > bgx ? fwd : bgx;
    return m > bgw ? m : bgw;
}

static int
mv_all_finite(const double *v, long n)
{
    for (long i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return 0;
    return 1;
}

/* Forward panels from W by column (RP apart), and the heads padded. */
static void
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
static void
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

/* Weight-gradient groups: 4x4 patches when x looks like a square image of
 * side >= 8 (C = s*s), else 16 consecutive inputs. Only speed depends on the
 * grouping (inputs zero together are skipped together), never a result. */
static int
mv_groups(int C, int *groups)
{
    int s = 0;
    while ((s + 1) * (s + 1) <= C)
        s++;
    int g = 0;
    if (s * s == C && s >= 8) {
        for (int y0 = 0; y0 < s; y0 += 4)
            for (int x0 = 0; x0 < s; x0 += 4, g++)
                for (int i = 0; i < MV_BGW_MK; i++) {
                    const int y = y0 + i / 4, x = x0 + i % 4;
                    groups[g * MV_BGW_MK + i] = (y < s && x < s) ? y * s + x : -1;
                }
        return g;
    }
    for (int c0 = 0; c0 < C; c0 += MV_BGW_MK, g++)
        for (int i = 0; i < MV_BGW_MK; i++)
            groups[g * MV_BGW_MK + i] = c0 + i < C ? c0 + i : -1;
    return g;
}

/* The loops, one set per instruction set (kernels_body.c), chosen at load. */
typedef struct {
    const char *isa;
    void (*fwd)(const double *wp, const double *hp, int R, int C, int start, int skip,
                const double *X, long ldx, double *Y, long ldy, int r0, int r1, void *scratch);
    void (*bgx)(const double *wq, const int *perm, int R, int C, int skip, const double *GY, long ldgy,
                double *GX, long ldgx, int r0, int r1, void *scratch);
    void (*bgw)(int R, int C, int n, const double *const *xrow, const double *const *gyrow, double *GW,
                long ldgw, const int *groups, int g0, int g1, int p0, int p1, void *scratch);
    void (*bgh)(int R, int n, const double *const *gyrow, double *GH);
} MatVecKernels;
