/* ---- the loop kernels of the MatVec ops: their interface -------------------
 *
 * A MatVec is y[n] = h[n] + W[n][0]*x[0] + ... + W[n][C-1]*x[C-1] for n < R,
 * for every input row, each output ONE running sum whose terms are added in
 * the interpreter's order: acc = acc + (w*x), the product rounded, then the
 * sum rounded; no FMA (see the floating-point contract at the top of the
 * module), no reassociation, no partial sums. Speed comes only from working
 * on many independent sums at once: one micro-kernel (kernels_body.c, built
 * once per instruction set) holds a row of up to 64 lanes of running sums in
 * registers and adds B[k] * a_k over a list of the terms that count, B a
 * packed panel that stays in L1: forward, a row's y over its own nonzero x;
 * input gradient, a row's gx over its own nonzero gy (in backward order);
 * weight gradient, an input's gradient row over the rows where its x is
 * nonzero. So the work follows each row's (each input's) nonzeros.
 *
 * Zero skipping: a term w * 0 with w finite is a signed zero, and adding a
 * signed zero to a running sum leaves it unchanged unless the sum is -0.0;
 * a sum that does not start at -0.0 never becomes -0.0 (in round-to-nearest,
 * only -0 + -0 is -0). So a term whose x (or gradient) is zero is left out
 * while the other factor is finite and the sum did not start at -0.0 (a
 * forward row whose sums may start at -0.0 lists every term). Non-finite
 * data is never skipped, so it gives the interpreter's bits too.
 *
 * Layouts (rows of a block are ROW_STRIDE doubles apart):
 *   x of row r          v + r*ld + x0 + k
 *   y of row r          v + r*ld + y0 + n, with room for round16(R) values
 *   W                   the parameters, by column: W[n][k] = p[w0 + k*RP + n],
 *                       RP = round16(R) (the padding stays 0)
 *   gradient of W       gp[w0 + k*RP + n], the same layout
 *   forward panels      wp[64q*C + k*nw + i] = W[64q + i][k], nw = min(64, round8(R) - 64q)  (aux)
 *   heads, padded       hp[n]                                 (aux)
 *   input-grad panels   wq[64q*R + j*nw + i] = W[perm[j]][64q + i], nw = min(64, round8(C) - 64q)  (aux)
 */
#ifndef NN_AMALGAMATION
#include "contract.h"
#endif


/* MV_NR (the lanes of W's rows and gradient: round16(R); the weight
 * gradient's split of neurons counts panels of 16), MV_BGW_MK (inputs per
 * group of the weight gradient's split), MV_PW and MV_BGW_PW (lanes per packed
 * panel of W and of gy), MV_RCH (rows whose lists are built together),
 * MV_L1_DOUBLES (a panel block that stays in L1) and MV_RB_MAX (most rows per
 * block of the weight gradient) are the prologue's, from
 * compiler/constants.py: the code generator lays out the weights and sizes
 * the scratch by them. */

/* The loops, one set per instruction set (kernels_body.c), chosen at load
 * (the module state's `kernels`, which each Block carries as `k`). */
struct MatVecKernels {
    const char *isa;
    void (*fwd)(const double *wp, const double *hp, int R, int C, int start, int skip,
                const double *X, long ldx, double *Y, long ldy, int r0, int r1, void *scratch);
    void (*bgx)(const double *wq, const int *perm, int R, int C, int skip, const double *GY, long ldgy,
                double *GX, long ldgx, int r0, int r1, void *scratch);
    void (*bgw)(int R, int C, int n, const double *const *xrow, const double *const *gyrow, double *GW,
                long ldgw, const int *groups, int g0, int g1, int p0, int p1, void *scratch);
    void (*bgh)(int R, int n, const double *const *gyrow, double *GH);
    int (*pack_fwd)(const double *wt, int R, int C, int RP, double *wp);
    void (*pack_bgx)(const double *wt, const int *perm, int R, int C, int RP, double *wq);
};

HIDDEN int mv_all_finite(const double *v, long n);
HIDDEN int mv_pack_fwd(const double *wt, int R, int C, int RP, double *wp);
HIDDEN void mv_pack_bgx(const double *wt, const int *perm, int R, int C, int RP, double *wq);
HIDDEN const MatVecKernels *mv_choose_kernels(void);
HIDDEN extern unsigned long long mv_macs[3];   /* the loops' work, for benchmarks (kernels.c) */
