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
                double a0[8], a1[8], a2[8], a3[8];
                for (int l = 0; l < 8; l++)
                    a0[l] = a1[l] = a2[l] = a3[l] = hp[o0 + l];
                for (int k = 0; k < K; k++) {
                    const double *w = wp + (size_t)k * OP + o0;
                    const double s0 = v[x0[k]], s1 = v[x1[k]], s2 = v[x2[k]], s3 = v[x3[k]];
                    for (int l = 0; l < 8; l++) {
                        a0[l] += w[l] * s0;
                        a1[l] += w[l] * s1;
                        a2[l] += w[l] * s2;
                        a3[l] += w[l] * s3;
                    }
                }
                for (int l = 0; l < n; l++) {
                    v[c->y[p0 * O + o0 + l]] = a0[l];
                    v[c->y[p1 * O + o0 + l]] = a1[l];
                    v[c->y[p2 * O + o0 + l]] = a2[l];
                    v[c->y[p3 * O + o0 + l]] = a3[l];
                }
            }
            for (; i < c->nfull; i++) {
                const int p0 = c->full[i];
                const int *x0 = c->x + (size_t)p0 * K;
                double a0[8];
                for (int l = 0; l < 8; l++)
                    a0[l] = hp[o0 + l];
                for (int k = 0; k < K; k++) {
                    const double *w = wp + (size_t)k * OP + o0;
                    const double s0 = v[x0[k]];
                    for (int l = 0; l < 8; l++)
                        a0[l] += w[l] * s0;
                }
                for (int l = 0; l < n; l++)
                    v[c->y[p0 * O + o0 + l]] = a0[l];
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

/* Input gradient: each input's gradient gets w * gy from every window that
 * reads it, in the interpreter's backward order (rows by descending rank,
 * a row's offsets last to first). Inputs whose lists read the same weights
 * in the same order share a chunk of 8 lanes: per step one weight, and each
 * lane's own gy. Chunk q: lanes cx[8q..8q+7] (the first cn[q] real; the
 * others repeat lane 0 and are not stored), steps cs[q]..cs[q+1]-1 of cw
 * (p index of the weight) and cg (8 row indices of gy per step). */
static void
CV_NAME(conv_bgx)(const ConvOp *c, const Block *b, int r0, int r1)
{
    const double *CV_RESTRICT p = b->p;
    for (int r = r0; r < r1; r++) {
        double *CV_RESTRICT g = ROW(b->g, r);
        for (int q = 0; q < c->nchunks; q++) {
            const int *lane = c->cx + 8 * q;
            double acc[8];
            for (int l = 0; l < 8; l++)
                acc[l] = g[lane[l]];
            for (int t = c->cs[q]; t < c->cs[q + 1]; t++) {
                const double w = p[c->cw[t]];
                const int *gi = c->cg + 8 * (size_t)t;
                for (int l = 0; l < 8; l++)
                    acc[l] += w * g[gi[l]];
            }
            for (int l = 0; l < c->cn[q]; l++)
                g[lane[l]] = acc[l];
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
    const int O = c->O, K = c->K, P = c->P;
    const int o0 = O * part / parts, o1 = O * (part + 1) / parts, n = o1 - o0;
    if (n <= 0)
        return;
    double *CV_RESTRICT acc = (double *)scratch, *CV_RESTRICT xk = acc + (size_t)n * K;
    double *CV_RESTRICT ah = xk + K;
    for (int o = o0; o < o1; o++) {
        for (int k = 0; k < K; k++)
            acc[(size_t)(o - o0) * K + k] = b->gp[c->w[o * K + k]];
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
                    double *CV_RESTRICT a = acc + (size_t)(o - o0) * K;
                    for (int k = 0; k < K; k++)
                        a[k] += xk[k] * gy;
                    ah[o - o0] += gy;
                }
            } else {
                for (int o = o0; o < o1; o++) {
                    const double gy = g[ys[o]];
                    double *CV_RESTRICT a = acc + (size_t)(o - o0) * K;
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
            b->gp[c->w[o * K + k]] = acc[(size_t)(o - o0) * K + k];
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
