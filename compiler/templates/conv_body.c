/* ---- Conv loops, built for one instruction set --------------------------------
 *
 * Included once per instruction set by compiler/codegen/conv.py, with CV_ISA
 * (the suffix of every name here), CV_LEVEL (2 AVX-512, 1 AVX2, 0 the
 * baseline, -1 plain C: tcc) and the register tiles' shapes (CV_FWD_SHAPES,
 * CV_BGW_SHAPES) set before it. The loops are the same C at every level;
 * only how wide the compiler makes the 8-lane inner loops and how many sums
 * a tile holds differ, so every level gives the same bits: each output is
 * ONE running sum, its terms added in the interpreter's order, acc = acc +
 * (w * x) (two roundings: no FMA, see contract.h), lanes and tiles being
 * independent sums.
 */
#if CV_LEVEL >= 1 && defined(__x86_64__)
#  if defined(__clang__)
#    if CV_LEVEL == 2
#      pragma clang attribute push (__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq"))), apply_to = function)
#    else
#      pragma clang attribute push (__attribute__((target("avx2"))), apply_to = function)
#    endif
#  else
#    pragma GCC push_options
#    if CV_LEVEL == 2
#      pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq")
#    else
#      pragma GCC target("avx2")
#    endif
#  endif
#endif

/* Eight lanes: one AVX-512 vector, else a plain loop the compiler may
 * vectorize; the same operations on each lane either way. */
#if CV_LEVEL == 2 && defined(__x86_64__)
typedef double CV_NAME(v8) __attribute__((vector_size(64), aligned(8)));
#define CV_V8 CV_NAME(v8)
#define CV_LANES(acc) CV_V8 acc
#define CV_SET(acc, p) ((acc) = *(const CV_V8 *)(p))
#define CV_MADD(acc, p, s) ((acc) += *(const CV_V8 *)(p) * (s))      /* acc + (w * s): two roundings */
#define CV_GET(acc, l) ((acc)[l])
#define CV_PUT(p, acc) (*(CV_V8 *)(p) = (acc))
#define CV_UNROLL _Pragma("GCC unroll 32")
#else
#define CV_LANES(acc) double acc[8]
#define CV_SET(acc, p) do { for (int l_ = 0; l_ < 8; l_++) (acc)[l_] = (p)[l_]; } while (0)
#define CV_MADD(acc, p, s) do { for (int l_ = 0; l_ < 8; l_++) (acc)[l_] += (p)[l_] * (s); } while (0)
#define CV_GET(acc, l) ((acc)[l])
#define CV_PUT(p, acc) do { for (int l_ = 0; l_ < 8; l_++) (p)[l_] = (acc)[l_]; } while (0)
#if CV_LEVEL >= 0
#define CV_UNROLL _Pragma("GCC unroll 32")
#else
#define CV_UNROLL
#endif
#endif

/* One step of a register tile s[N][OV] (the forward's and the weight
 * gradient's): s[t][u] = s[t][u] + (vec[8u..8u+7] * v[xs[t]]) for t < N. */
#define CV_TILE_STEP(s, N, OV, v, xs, vec)                                                             \
    CV_UNROLL for (int t_ = 0; t_ < (N); t_++) {                                                       \
        const double x_ = (v)[(xs)[t_]];                                                               \
        CV_UNROLL for (int u_ = 0; u_ < (OV); u_++)                                                    \
            CV_MADD(s[t_][u_], (vec) + 8 * u_, x_);                                                    \
    }

/* A tile of the forward: NP whole windows (positions full[i0..]) by OV
 * vectors of 8 channels of running sums in registers while the offsets go
 * by in order: y[o][p] = h[o], then y[o][p] = y[o][p] + (W[o][k] * x[p][k])
 * for k = 0, 1, ... (wp[k*OP + o]: W packed by offset; x[p][k] is
 * v[xk[k*nf + i]]). The shapes a program needs are CV_FWD_SHAPES(X),
 * X(NP, OV) each (codegen/conv.py). */
#define CV_FWD_TILE(NP, OV)                                                                            \
static void                                                                                            \
CV_NAME(fwd_##NP##_##OV)(const ConvOp *c, double *CV_RESTRICT v, int i0, int o0,                       \
                         const double *CV_RESTRICT wp, const double *CV_RESTRICT hp)                   \
{                                                                                                      \
    const int O = c->O, OP = c->OP, K = c->K, nf = c->nfull;                                           \
    CV_LANES(s[NP][OV]);                                                                               \
    CV_UNROLL for (int t = 0; t < NP; t++)                                                             \
        CV_UNROLL for (int u = 0; u < OV; u++)                                                         \
            CV_SET(s[t][u], hp + o0 + 8 * u);                                                          \
    for (int k = 0; k < K; k++) {                                                                      \
        const int *CV_RESTRICT xs = c->xk + (size_t)k * nf + i0;                                       \
        const double *CV_RESTRICT w = wp + (size_t)k * OP + o0;                                        \
        CV_TILE_STEP(s, NP, OV, v, xs, w);                                                             \
    }                                                                                                  \
    CV_UNROLL for (int t = 0; t < NP; t++) {                                                           \
        const int *y = c->y + (size_t)c->full[i0 + t] * O;                                             \
        CV_UNROLL for (int u = 0; u < OV; u++)                                                         \
            for (int l = 0; l < 8 && o0 + 8 * u + l < O; l++)                                          \
                v[y[o0 + 8 * u + l]] = CV_GET(s[t][u], l);                                             \
    }                                                                                                  \
}
CV_FWD_SHAPES(CV_FWD_TILE)
#undef CV_FWD_TILE

static void
CV_NAME(fwd_tile)(int np, int ov, const ConvOp *c, double *v, int i0, int o0, const double *wp, const double *hp)
{
#define CV_FWD_CALL(NP, OV)                                                                            \
    if (np == NP && ov == OV) {                                                                        \
        CV_NAME(fwd_##NP##_##OV)(c, v, i0, o0, wp, hp);                                                \
        return;                                                                                        \
    }
    CV_FWD_SHAPES(CV_FWD_CALL)
#undef CV_FWD_CALL
}

/* Forward: y[o][p] = h[o] + W[o][k]*x[p][k] + ... over the offsets k present,
 * ascending. Whole windows run in register tiles (c->ftiles for this
 * instruction set: positions full[i0..], channels 8 * v0..; W packed by
 * offset, wp[k*OP + o]); windows cut by the padding one sum at a time. */
static void
CV_NAME(conv_fwd)(const ConvOp *c, const Block *b, int r0, int r1, void *scratch)
{
    const int O = c->O, OP = c->OP, K = c->K;
    const int n_tiles = c->n_ftiles[CV_LEVEL + 1], *tiles = c->ftiles[CV_LEVEL + 1];
    double *CV_RESTRICT wp = (double *)scratch, *CV_RESTRICT hp = wp + (size_t)K * OP;
    for (int k = 0; k < K; k++)
        for (int o = 0; o < OP; o++)
            wp[(size_t)k * OP + o] = o < O ? b->p[c->w[o * K + k]] : 0.0;
    for (int o = 0; o < OP; o++)
        hp[o] = o < O ? b->p[c->h[o]] : 0.0;
    for (int r = r0; r < r1; r++) {
        double *CV_RESTRICT v = ROW(b->v, r);
        for (int i = 0; i < n_tiles; i++) {
            const int *tl = tiles + 4 * i;
            CV_NAME(fwd_tile)(tl[1], tl[3], c, v, tl[0], 8 * tl[2], wp, hp);
        }
        for (int i = 0; i < c->npart; i++) {
            const int p0 = c->part[i];
            const int *x0 = c->x + (size_t)p0 * K;
            for (int o = 0; o < O; o++) {
                double a = hp[o];
                for (int k = 0; k < K; k++)
                    if (x0[k] >= 0)
                        a += wp[(size_t)k * OP + o] * v[x0[k]];
                v[c->y[p0 * O + o]] = a;
            }
        }
    }
}

/* Input gradient, pulled: where the rows' order is channel by channel with
 * the same order of positions in each (c->pull), an input's terms come
 * channel by channel, and within a channel in the order of its positions:
 * for input j, gx[j] = gx[j] + (gy[o][p] * W[o][k]) over o in that order,
 * then (p, k) of its list (c->jstart, c->jp, c->jk). Its running sums stay
 * in registers: NV vectors of 8 images (independent sums advancing
 * together, each term's weight loaded once for all of them). gyT[(o * P +
 * p) * L + i] and gxT[j * L + i] hold image i of L = 8 * NV. */
#if CV_LEVEL >= 1
#define CV_BGX_NV 4
#elif CV_LEVEL == 0
#define CV_BGX_NV 2
#else
#define CV_BGX_NV 1
#endif
#if CV_LEVEL == 2
#define CV_BGX_JB 4             /* inputs at once: 16 of 32 zmm accumulate */
#else
#define CV_BGX_JB 1
#endif
#define CV_BGX_PULL(NAME, NV, JB)                                                                      \
static void                                                                                            \
CV_NAME(NAME)(const ConvOp *c, int j0, const double *CV_RESTRICT wk, const double *CV_RESTRICT gyT,    \
              double *CV_RESTRICT gxT)                                                                 \
{                                                                                                      \
    const int O = c->O, K = c->K, P = c->P, L = 8 * NV;                                                \
    CV_LANES(a[JB][NV]);                                                                               \
    CV_UNROLL for (int t = 0; t < JB; t++)                                                             \
        CV_UNROLL for (int u = 0; u < NV; u++)                                                         \
            CV_SET(a[t][u], gxT + (size_t)(j0 + t) * L + 8 * u);                                       \
    for (int q = 0; q < O; q++) {                                                                      \
        const int o = c->oorder[q];                                                                    \
        const double *CV_RESTRICT w = wk + (size_t)o * K;                                              \
        const double *CV_RESTRICT gy = gyT + (size_t)o * P * L;                                        \
        CV_UNROLL for (int t = 0; t < JB; t++)                                                         \
            for (int e = c->jstart[j0 + t]; e < c->jstart[j0 + t + 1]; e++) {                          \
                const double wv = w[c->jk[e]];                                                         \
                const double *CV_RESTRICT g = gy + (size_t)c->jp[e] * L;                               \
                CV_UNROLL for (int u = 0; u < NV; u++)                                                 \
                    CV_MADD(a[t][u], g + 8 * u, wv);                                                   \
            }                                                                                          \
    }                                                                                                  \
    CV_UNROLL for (int t = 0; t < JB; t++)                                                             \
        CV_UNROLL for (int u = 0; u < NV; u++)                                                         \
            CV_PUT(gxT + (size_t)(j0 + t) * L + 8 * u, a[t][u]);                                       \
}
/* one input, 8 images; one input, 8 * CV_BGX_NV images; CV_BGX_JB inputs at once */
CV_BGX_PULL(bgx_pull_one, 1, 1)
CV_BGX_PULL(bgx_pull_wide, CV_BGX_NV, 1)
CV_BGX_PULL(bgx_pull_block, CV_BGX_NV, CV_BGX_JB)
#undef CV_BGX_PULL

/* Input gradient: the rows in the interpreter's backward order (rows[],
 * descending rank), each row's offsets last to first: gx += W[o][k] * gy, as
 * the interpreter's backward adds them. Every input's contributions then
 * come in its own order (a subsequence of that one). Eight images at a time
 * (or, pulled, 8 * CV_BGX_NV) run as the lanes of vectors: their gy and gx
 * are copied into lanes (gyT[(o*P + p)*L + l], gxT[j*L + l] for input j of
 * xlist) and back; the images left over run one by one. xg[p*K + k]
 * (xid[p*K + k]): the row index (the index in xlist) of x[p][k] when its
 * gradient is needed, else -1. */
static void
CV_NAME(conv_bgx)(const ConvOp *c, const Block *b, int r0, int r1, void *scratch)
{
    const int O = c->O, K = c->K, P = c->P, NX = c->nx;
    double *CV_RESTRICT wk = (double *)scratch;       /* W[o][k] at o*K + k */
    double *CV_RESTRICT gyT = wk + (((size_t)O * K + 7) & ~(size_t)7);
    double *CV_RESTRICT gxT = gyT + (size_t)O * P * 8 * CV_BGX_NV;
    for (int i = 0; i < O * K; i++)
        wk[i] = b->p[c->w[i]];
    int r = r0;
    while (r + 8 <= r1) {
        const int nv = c->pull && r + 8 * CV_BGX_NV <= r1 ? CV_BGX_NV : 1, L = 8 * nv;
        for (int l = 0; l < L; l++) {
            const double *CV_RESTRICT g = ROW(b->g, r + l);
            for (int o = 0; o < O; o++)
                for (int p0 = 0; p0 < P; p0++)
                    gyT[((size_t)o * P + p0) * L + l] = g[c->y[p0 * O + o]];
            for (int j = 0; j < NX; j++)
                gxT[(size_t)j * L + l] = g[c->xlist[j]];
        }
        if (c->pull && nv == CV_BGX_NV) {
            int j = 0;
            for (; j + CV_BGX_JB <= NX; j += CV_BGX_JB)
                CV_NAME(bgx_pull_block)(c, j, wk, gyT, gxT);
            for (; j < NX; j++)
                CV_NAME(bgx_pull_wide)(c, j, wk, gyT, gxT);
        } else if (c->pull)
            for (int j = 0; j < NX; j++)
                CV_NAME(bgx_pull_one)(c, j, wk, gyT, gxT);
        else
            for (int i = 0; i < O * P; i++) {
                const int o = c->rows[i] / P, p0 = c->rows[i] % P;
                const double *gy = gyT + (size_t)c->rows[i] * 8;
                const double *w = wk + (size_t)o * K;
                const int *xs = c->xid + (size_t)p0 * K;
                for (int k = K - 1; k >= 0; k--)
                    if (xs[k] >= 0) {
                        double *CV_RESTRICT gx = gxT + (size_t)xs[k] * 8;
                        CV_LANES(t);
                        CV_SET(t, gx);
                        CV_MADD(t, gy, w[k]);
                        CV_PUT(gx, t);
                    }
            }
        for (int l = 0; l < L; l++) {
            double *CV_RESTRICT g = ROW(b->g, r + l);
            for (int j = 0; j < NX; j++)
                g[c->xlist[j]] = gxT[(size_t)j * L + l];
        }
        r += L;
    }
    for (; r < r1; r++) {
        double *CV_RESTRICT g = ROW(b->g, r);
        for (int i = 0; i < O * P; i++) {
            const int o = c->rows[i] / P, p0 = c->rows[i] % P;
            const double gy = g[c->y[p0 * O + o]];
            const double *w = wk + (size_t)o * K;
            const int *xs = c->xg + (size_t)p0 * K;
            for (int k = K - 1; k >= 0; k--)
                if (xs[k] >= 0)
                    g[xs[k]] += w[k] * gy;
        }
    }
}
#undef CV_BGX_NV
#undef CV_BGX_JB

/* A tile of the weight gradient: TK offsets by OV vectors of 8 channels of
 * running sums, in registers while the positions hi, hi-1, ..., lo go by:
 * a[t][c] = a[t][c] + (gy[p][c] * x[p][t]) (x[p][t] is v[x[p * ldx + t]],
 * gy[p] the row's gathered gy at gt + p * ldg). The shapes a program needs
 * are CV_BGW_SHAPES(X), X(TK, OV) each: codegen/conv.py plans them for the
 * registers of each instruction set. */
#define CV_BGW_TILE(TK, OV)                                                                            \
static void                                                                                            \
CV_NAME(bgw_##TK##_##OV)(double *CV_RESTRICT a, long lda, const double *CV_RESTRICT v,                \
                         const int *CV_RESTRICT x, long ldx, const double *CV_RESTRICT gt, long ldg,   \
                         int hi, int lo)                                                               \
{                                                                                                      \
    CV_LANES(s[TK][OV]);                                                                               \
    CV_UNROLL for (int t = 0; t < TK; t++)                                                             \
        CV_UNROLL for (int u = 0; u < OV; u++)                                                         \
            CV_SET(s[t][u], a + t * lda + 8 * u);                                                      \
    for (int p = hi; p >= lo; p--) {                                                                   \
        const int *CV_RESTRICT xp = x + (size_t)p * ldx;                                               \
        const double *CV_RESTRICT gp = gt + (size_t)p * ldg;                                           \
        CV_TILE_STEP(s, TK, OV, v, xp, gp);                                                            \
    }                                                                                                  \
    CV_UNROLL for (int t = 0; t < TK; t++)                                                             \
        CV_UNROLL for (int u = 0; u < OV; u++)                                                         \
            CV_PUT(a + t * lda + 8 * u, s[t][u]);                                                      \
}
CV_BGW_SHAPES(CV_BGW_TILE)
#undef CV_BGW_TILE

/* The tile of shape (tk, ov) over positions hi down to lo. */
static void
CV_NAME(bgw_tile)(int tk, int ov, double *a, long lda, const double *v, const int *x, long ldx,
                  const double *gt, long ldg, int hi, int lo)
{
#define CV_BGW_CALL(TK, OV)                                                                            \
    if (tk == TK && ov == OV) {                                                                        \
        CV_NAME(bgw_##TK##_##OV)(a, lda, v, x, ldx, gt, ldg, hi, lo);                                  \
        return;                                                                                        \
    }
    CV_BGW_SHAPES(CV_BGW_CALL)
#undef CV_BGW_CALL
}

/* Weight and head gradients over a block's rows: each weight's sum gets
 * gy * x row by row, within a row the positions in the interpreter's
 * backward order (descending rank: position P-1 first). The sums are
 * independent: this part runs its share of the tiles (c->tiles for this
 * instruction set: offsets k0.., channels 8 * v0..) and of the heads.
 * Windows cut by the padding add their terms one by one between runs of
 * whole ones. */
static void
CV_NAME(conv_bgw)(const ConvOp *c, const Block *b, int rows, int part, int parts, void *scratch)
{
    const int O = c->O, OP = c->OP, K = c->K, P = c->P;
    const int n_tiles = c->n_tiles[CV_LEVEL + 1];
    const int *tiles = c->tiles[CV_LEVEL + 1];     /* k0, tk, v0, ov each */
    const int t0 = n_tiles * part / parts, t1 = n_tiles * (part + 1) / parts;
    const int h0 = O * part / parts, h1 = O * (part + 1) / parts;
    if (t0 == t1 && h0 == h1)
        return;
    /* acc[k][o]: the sums (lanes past O add gy 0 and are never stored);
     * gt[p][o]: a row's gy; ah[o]: the heads' */
    double *CV_RESTRICT acc = (double *)scratch, *CV_RESTRICT gt = acc + (size_t)K * OP;
    double *CV_RESTRICT ah = gt + (size_t)P * OP;
    for (int k = 0; k < K; k++)
        for (int o = 0; o < OP; o++)
            acc[(size_t)k * OP + o] = o < O ? b->gp[c->w[o * K + k]] : 0.0;
    for (int o = h0; o < h1; o++)
        ah[o] = b->gp[c->h[o]];
    for (int p0 = 0; p0 < P; p0++)
        for (int o = O; o < OP; o++)
            gt[(size_t)p0 * OP + o] = 0.0;
    for (int r = 0; r < rows; r++) {
        const double *CV_RESTRICT v = ROW(b->v, r), *CV_RESTRICT g = ROW(b->g, r);
        for (int p0 = 0; p0 < P; p0++)
            for (int o = 0; o < O; o++)
                gt[(size_t)p0 * OP + o] = g[c->y[p0 * O + o]];
        for (int hi = P - 1; hi >= 0;) {
            if (!c->is_full[hi]) {
                const int *xs = c->x + (size_t)hi * K;
                const double *gy = gt + (size_t)hi * OP;
                for (int i = t0; i < t1; i++) {
                    const int *tl = tiles + 4 * i;
                    for (int k = tl[0]; k < tl[0] + tl[1]; k++)
                        if (xs[k] >= 0)
                            for (int o = 8 * tl[2]; o < 8 * (tl[2] + tl[3]); o++)
                                acc[(size_t)k * OP + o] += gy[o] * v[xs[k]];
                }
                hi--;
                continue;
            }
            int lo = hi;
            while (lo > 0 && c->is_full[lo - 1])
                lo--;
            for (int i = t0; i < t1; i++) {
                const int *tl = tiles + 4 * i;
                CV_NAME(bgw_tile)(tl[1], tl[3], acc + (size_t)tl[0] * OP + 8 * tl[2], OP, v, c->x + tl[0], K,
                                  gt + 8 * tl[2], OP, hi, lo);
            }
            hi = lo - 1;
        }
        for (int o = h0; o < h1; o++) {
            double h = ah[o];
            for (int p0 = P - 1; p0 >= 0; p0--)
                h += gt[(size_t)p0 * OP + o];
            ah[o] = h;
        }
    }
    for (int i = t0; i < t1; i++) {
        const int *tl = tiles + 4 * i;
        for (int k = tl[0]; k < tl[0] + tl[1]; k++)
            for (int o = 8 * tl[2]; o < 8 * (tl[2] + tl[3]) && o < O; o++)
                b->gp[c->w[o * K + k]] = acc[(size_t)k * OP + o];
    }
    for (int o = h0; o < h1; o++)
        b->gp[c->h[o]] = ah[o];
}

#if CV_LEVEL >= 1 && defined(__x86_64__)
#  if defined(__clang__)
#    pragma clang attribute pop
#  else
#    pragma GCC pop_options
#  endif
#endif
#undef CV_V8
#undef CV_LANES
#undef CV_SET
#undef CV_MADD
#undef CV_GET
#undef CV_PUT
#undef CV_UNROLL
#undef CV_TILE_STEP
