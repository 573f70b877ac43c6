/* ---- Conv loops, built for one instruction set --------------------------------
 *
 * Included once per instruction set by compiler/codegen/conv.py, with CV_ISA
 * (the suffix of every name here) and CV_LEVEL set before it: 2 AVX-512, 1
 * AVX2, 0 the baseline, -1 plain C (tcc). The loops are the same C at every
 * level; only how wide the compiler makes the 8-lane inner loops differs, so
 * every level gives the same bits: each output is ONE running sum, its
 * terms added in the interpreter's order, acc = acc + (w * x) (two
 * roundings: no FMA, see contract.h), lanes being independent sums.
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
#else
#define CV_LANES(acc) double acc[8]
#define CV_SET(acc, p) do { for (int l_ = 0; l_ < 8; l_++) (acc)[l_] = (p)[l_]; } while (0)
#define CV_MADD(acc, p, s) do { for (int l_ = 0; l_ < 8; l_++) (acc)[l_] += (p)[l_] * (s); } while (0)
#define CV_GET(acc, l) ((acc)[l])
#define CV_PUT(p, acc) do { for (int l_ = 0; l_ < 8; l_++) (p)[l_] = (acc)[l_]; } while (0)
#endif

/* Forward: y[o][p] = h[o] + W[o][k]*x[p][k] + ... over the offsets k present,
 * ascending. Full windows run four positions by eight channels at a time
 * (W packed by offset: wp[k*OP + o], one row of 8 channels loaded once for
 * the four positions); windows cut by the padding one sum at a time. */
static void
CV_NAME(conv_fwd)(const ConvOp *c, const Block *b, int r0, int r1, void *scratch)
{
    const int O = c->O, OP = c->OP, K = c->K;
    double *CV_RESTRICT wp = (double *)scratch, *CV_RESTRICT hp = wp + (size_t)K * OP;
    for (int k = 0; k < K; k++)
        for (int o = 0; o < OP; o++)
            wp[(size_t)k * OP + o] = o < O ? b->p[c->w[o * K + k]] : 0.0;
    for (int o = 0; o < OP; o++)
        hp[o] = o < O ? b->p[c->h[o]] : 0.0;
    for (int r = r0; r < r1; r++) {
        double *CV_RESTRICT v = ROW(b->v, r);
        for (int o0 = 0; o0 < OP; o0 += 8) {
            const int n = O - o0 < 8 ? O - o0 : 8;
            int i = 0;
            for (; i + 4 <= c->nfull; i += 4) {
                const int p0 = c->full[i], p1 = c->full[i + 1], p2 = c->full[i + 2], p3 = c->full[i + 3];
                const int *x0 = c->x + (size_t)p0 * K, *x1 = c->x + (size_t)p1 * K;
                const int *x2 = c->x + (size_t)p2 * K, *x3 = c->x + (size_t)p3 * K;
                CV_LANES(a0);
                CV_LANES(a1);
                CV_LANES(a2);
                CV_LANES(a3);
                CV_SET(a0, hp + o0);
                CV_SET(a1, hp + o0);
                CV_SET(a2, hp + o0);
                CV_SET(a3, hp + o0);
                for (int k = 0; k < K; k++) {
                    const double *w = wp + (size_t)k * OP + o0;
                    const double s0 = v[x0[k]], s1 = v[x1[k]], s2 = v[x2[k]], s3 = v[x3[k]];
                    CV_MADD(a0, w, s0);
                    CV_MADD(a1, w, s1);
                    CV_MADD(a2, w, s2);
                    CV_MADD(a3, w, s3);
                }
                for (int l = 0; l < n; l++) {
                    v[c->y[p0 * O + o0 + l]] = CV_GET(a0, l);
                    v[c->y[p1 * O + o0 + l]] = CV_GET(a1, l);
                    v[c->y[p2 * O + o0 + l]] = CV_GET(a2, l);
                    v[c->y[p3 * O + o0 + l]] = CV_GET(a3, l);
                }
            }
            for (; i < c->nfull; i++) {
                const int p0 = c->full[i];
                const int *x0 = c->x + (size_t)p0 * K;
                CV_LANES(a0);
                CV_SET(a0, hp + o0);
                for (int k = 0; k < K; k++)
                    CV_MADD(a0, wp + (size_t)k * OP + o0, v[x0[k]]);
                for (int l = 0; l < n; l++)
                    v[c->y[p0 * O + o0 + l]] = CV_GET(a0, l);
            }
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

/* Input gradient: the rows in the interpreter's backward order (rows[],
 * descending rank), each row's offsets last to first: gx += W[o][k] * gy, as
 * the interpreter's backward adds them. Every input's contributions then
 * come in its own order (a subsequence of that one). Eight images at a time
 * run as the lanes of one vector: their gy and gx are copied into lanes
 * (gyT[(o*P + p)*8 + l], gxT[j*8 + l] for input j of xlist) and back; the
 * images left over run one by one. xg[p*K + k] (xid[p*K + k]): the row
 * index (the index in xlist) of x[p][k] when its gradient is needed, else -1. */
static void
CV_NAME(conv_bgx)(const ConvOp *c, const Block *b, int r0, int r1, void *scratch)
{
    const int O = c->O, K = c->K, P = c->P, NX = c->nx;
    double *CV_RESTRICT wk = (double *)scratch;       /* W[o][k] at o*K + k */
    double *CV_RESTRICT gyT = wk + (((size_t)O * K + 7) & ~(size_t)7);
    double *CV_RESTRICT gxT = gyT + (size_t)O * P * 8;
    for (int i = 0; i < O * K; i++)
        wk[i] = b->p[c->w[i]];
    int r = r0;
    for (; r + 8 <= r1; r += 8) {
        for (int l = 0; l < 8; l++) {
            const double *CV_RESTRICT g = ROW(b->g, r + l);
            for (int o = 0; o < O; o++)
                for (int p0 = 0; p0 < P; p0++)
                    gyT[((size_t)o * P + p0) * 8 + l] = g[c->y[p0 * O + o]];
            for (int j = 0; j < NX; j++)
                gxT[(size_t)j * 8 + l] = g[c->xlist[j]];
        }
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
        for (int l = 0; l < 8; l++) {
            double *CV_RESTRICT g = ROW(b->g, r + l);
            for (int j = 0; j < NX; j++)
                g[c->xlist[j]] = gxT[(size_t)j * 8 + l];
        }
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

/* Weight and head gradients over a block's rows: each weight's sum gets
 * x * gy row by row, within a row the positions in the interpreter's
 * backward order (descending rank: position P-1 first); this part's
 * channels o0..o1-1 only (the sums are independent). */
static void
CV_NAME(conv_bgw)(const ConvOp *c, const Block *b, int rows, int part, int parts, void *scratch)
{
    const int O = c->O, K = c->K, P = c->P, KP = (K + 7) & ~7;
    const int o0 = O * part / parts, o1 = O * (part + 1) / parts, n = o1 - o0;
    if (n <= 0)
        return;
    /* per channel KP running sums (the lanes past K add 0 * gy and are never stored) */
    double *CV_RESTRICT acc = (double *)scratch, *CV_RESTRICT xk = acc + (size_t)n * KP;
    double *CV_RESTRICT ah = xk + KP;
    for (int k = K; k < KP; k++)
        xk[k] = 0.0;
    for (int o = o0; o < o1; o++) {
        for (int k = 0; k < KP; k++)
            acc[(size_t)(o - o0) * KP + k] = k < K ? b->gp[c->w[o * K + k]] : 0.0;
        ah[o - o0] = b->gp[c->h[o]];
    }
    for (int r = 0; r < rows; r++) {
        const double *CV_RESTRICT v = ROW(b->v, r), *CV_RESTRICT g = ROW(b->g, r);
        for (int p0 = P - 1; p0 >= 0; p0--) {
            const int *xs = c->x + (size_t)p0 * K;
            const int *ys = c->y + (size_t)p0 * O;
            if (c->is_full[p0]) {
                for (int k = 0; k < K; k++)
                    xk[k] = v[xs[k]];
                for (int o = o0; o < o1; o++) {
                    const double gy = g[ys[o]];
                    double *CV_RESTRICT a = acc + (size_t)(o - o0) * KP;
                    for (int k = 0; k < KP; k += 8) {
                        CV_LANES(t);
                        CV_SET(t, a + k);
                        CV_MADD(t, xk + k, gy);
                        CV_PUT(a + k, t);
                    }
                    ah[o - o0] += gy;
                }
            } else {
                for (int o = o0; o < o1; o++) {
                    const double gy = g[ys[o]];
                    double *CV_RESTRICT a = acc + (size_t)(o - o0) * KP;
                    for (int k = 0; k < K; k++)
                        if (xs[k] >= 0)
                            a[k] += v[xs[k]] * gy;
                    ah[o - o0] += gy;
                }
            }
        }
    }
    for (int o = o0; o < o1; o++) {
        for (int k = 0; k < K; k++)
            b->gp[c->w[o * K + k]] = acc[(size_t)(o - o0) * KP + k];
        b->gp[c->h[o]] = ah[o - o0];
    }
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
