/* ---- MatVec loops, built for one instruction set -----------------------------
 *
 * Included once per instruction set, with MV_ISA (the suffix of every name
 * here: ISA(fwd_tile) is fwd_tile_avx512) and MV_LEVEL set before it: 2 AVX-512 (one vector of 8 doubles per
 * zmm register), 1 AVX2 and 0 the baseline (8 lanes as two vectors of 4:
 * gcc lowers 64-byte vectors badly without AVX-512), -1 plain C (tcc). The
 * vector code and the plain code perform the same operations in the same
 * order; only how many independent sums advance at once differs.
 */
#if MV_LEVEL >= 1 && defined(__x86_64__)
#  if defined(__clang__)
#    if MV_LEVEL == 2
#      pragma clang attribute push (__attribute__((target("avx512f,avx512vl,avx512bw,avx512dq"))), apply_to = function)
#    else
#      pragma clang attribute push (__attribute__((target("avx2"))), apply_to = function)
#    endif
#  else
#    pragma GCC push_options
#    if MV_LEVEL == 2
#      pragma GCC target("avx512f,avx512vl,avx512bw,avx512dq")
#    else
#      pragma GCC target("avx2")
#    endif
#  endif
#endif

#if MV_LEVEL >= 0
#define VEC 1
#if MV_LEVEL == 2
typedef double ISA(v8) __attribute__((vector_size(64), aligned(64)));
typedef double ISA(v8u) __attribute__((vector_size(64), aligned(8)));
#define V8 ISA(v8)
#define LD(p) (*(const ISA(v8) *)(p))
#define LDU(p) (*(const ISA(v8u) *)(p))
#define ST(p, v) (*(ISA(v8) *)(p) = (v))
#define STU(p, v) (*(ISA(v8u) *)(p) = (v))
#define MULS(v, s) ((v) * (s))
#define MADD(a, v, s) ((a) += (v) * (s))       /* a = a + (v*s): two roundings */
#define ADDV(a, v) ((a) += (v))
#else
typedef double ISA(v4) __attribute__((vector_size(32), aligned(32)));
typedef double ISA(v4u) __attribute__((vector_size(32), aligned(8)));
typedef struct { ISA(v4) lo, hi; } ISA(v8);
#define V8 ISA(v8)
static inline V8 ISA(ld)(const double *p) { V8 r; r.lo = *(const ISA(v4) *)p; r.hi = *(const ISA(v4) *)(p + 4); return r; }
static inline V8 ISA(ldu)(const double *p) { V8 r; r.lo = *(const ISA(v4u) *)p; r.hi = *(const ISA(v4u) *)(p + 4); return r; }
static inline V8 ISA(muls)(V8 v, double s) { V8 r; r.lo = v.lo * s; r.hi = v.hi * s; return r; }
#define LD(p) ISA(ld)(p)
#define LDU(p) ISA(ldu)(p)
#define ST(p, v) (*(ISA(v4) *)(p) = (v).lo, *(ISA(v4) *)((p) + 4) = (v).hi)
#define STU(p, v) (*(ISA(v4u) *)(p) = (v).lo, *(ISA(v4u) *)((p) + 4) = (v).hi)
#define MULS(v, s) ISA(muls)((v), (s))
#define MADD(a, v, s) ((a).lo += (v).lo * (s), (a).hi += (v).hi * (s))
#define ADDV(a, v) ((a).lo += (v).lo, (a).hi += (v).hi)
#endif
#define UNROLL _Pragma("GCC unroll 32")
#if MV_LEVEL < 2
#define BGW_PART (MV_LEVEL == 1 ? 2 : 1)   /* 16 ymm (xmm) registers: 8 accumulate */
#elif defined(__clang__)
#define BGW_PART (MV_BGW_MK / 2)
#else
#define BGW_PART MV_BGW_MK
#endif
#define RESTRICT __restrict
#define ALIGN64 __attribute__((aligned(64)))
#else
#define UNROLL
#define RESTRICT
#define ALIGN64
#endif

/* The columns k >= c0 where any of the MR rows is nonzero (every column
 * unless skip), ascending, into ks; returns the count. */
static int
ISA(union_list)(const double *x, long ldx, int MR, int C, int c0, int skip, int *ks)
{
    int n = 0, k = c0;
    if (!skip) {
        for (; k < C; k++)
            ks[n++] = k;
        return n;
    }
#if MV_LEVEL == 2 && defined(__x86_64__)
    {
        const __m512d z = _mm512_setzero_pd();
        __m256i kv = _mm256_add_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (; k + 8 <= C; k += 8) {
            __mmask8 mk = 0;
            for (int m = 0; m < MR; m++)     /* NaN != 0: counts as nonzero */
                mk |= _mm512_cmp_pd_mask(_mm512_loadu_pd(x + m * ldx + k), z, _CMP_NEQ_UQ);
            _mm256_mask_compressstoreu_epi32(ks + n, mk, kv);
            n += __builtin_popcount(mk);
            kv = _mm256_add_epi32(kv, _mm256_set1_epi32(8));
        }
    }
#endif
    for (; k < C; k++) {                    /* branch-free append */
        int any = 0;
        for (int m = 0; m < MR; m++)
            any |= x[m * ldx + k] != 0.0;
        ks[n] = k;
        n += any;
    }
    return n;
}

/* Whether a sum starting with W[n][0] * x[0] can start at -0.0 for this
 * x[0], for some n: then that row's zeros must all be added. */
static int
ISA(starts_negative_zero)(double x0, int w0neg, int w0pos)
{
    return x0 == 0.0 && (signbit(x0) ? w0pos : w0neg);
}

/* One tile of MR rows (MV_FWD_MR, or 1 for leftover rows). start: 0 the heads
 * hp, 1 the first product (k = 0), 2 what Y holds. */
static void
ISA(fwd_tile)(const double *RESTRICT wp, const double *RESTRICT hp, int R, int C, int start, int skip,
                const double *X, long ldx, double *Y, long ldy, int MR, int *ks, int w0neg, int w0pos)
{
    enum { NR = MV_NR };
    const int np = (R + NR - 1) / NR;
    if (start == 1)
        for (int m = 0; m < MR; m++)
            if (ISA(starts_negative_zero)(X[m * ldx], w0neg, w0pos))
                skip = 0;
    const int n = ISA(union_list)(X, ldx, MR, C, start == 1, skip, ks);
    for (int p = 0; p < np; p++) {
        const double *RESTRICT w0 = wp + (size_t)p * C * NR;
        const int e = mv_min(R - p * NR, NR);
#ifdef VEC
        if (MR == MV_FWD_MR) {
            enum { M = MV_FWD_MR };
            const double *xr[M];
            V8 a[M][2];
            UNROLL for (int m = 0; m < M; m++) {
                xr[m] = X + m * ldx;
                if (start == 0) {
                    a[m][0] = LD(hp + p * NR);
                    a[m][1] = LD(hp + p * NR + 8);
                } else if (start == 1) {
                    a[m][0] = MULS(LD(w0), xr[m][0]);
                    a[m][1] = MULS(LD(w0 + 8), xr[m][0]);
                } else {    /* the row has room for 16 values from here (padded) */
                    a[m][0] = LDU(Y + m * ldy + p * NR);
                    a[m][1] = LDU(Y + m * ldy + p * NR + 8);
                }
            }
            for (int j = 0; j < n; j++) {
                const int k = ks[j];
                const double *RESTRICT wk = w0 + (size_t)k * NR;
                const V8 v0 = LD(wk), v1 = LD(wk + 8);
                UNROLL for (int m = 0; m < M; m++) {
                    const double xb = xr[m][k];
                    MADD(a[m][0], v0, xb);
                    MADD(a[m][1], v1, xb);
                }
            }
            UNROLL for (int m = 0; m < M; m++) {
                double *y = Y + m * ldy + p * NR;
                if (e == NR) {
                    STU(y, a[m][0]);
                    STU(y + 8, a[m][1]);
                } else {
                    double t[NR] ALIGN64;
                    ST(t, a[m][0]);
                    ST(t + 8, a[m][1]);
                    memcpy(y, t, sizeof(double) * e);
                }
            }
            continue;
        }
#endif
        for (int m = 0; m < MR; m++) {   /* plain C, and leftover rows */
            const double *x = X + m * ldx;
            double *y = Y + m * ldy + p * NR;
            double a[NR];
            for (int i = 0; i < NR; i++)
                a[i] = start == 0 ? hp[p * NR + i] : start == 1 ? w0[i] * x[0] : (i < e ? y[i] : 0.0);
            for (int j = 0; j < n; j++) {
                const double *wk = w0 + (size_t)ks[j] * NR;
                const double xb = x[ks[j]];
                for (int i = 0; i < NR; i++)
                    a[i] = a[i] + wk[i] * xb;
            }
            for (int i = 0; i < e; i++)
                y[i] = a[i];
        }
    }
}

static void
ISA(mv_fwd)(const double *wp, const double *hp, int R, int C, int start, int skip,
              const double *X, long ldx, double *Y, long ldy, int r0, int r1, void *scratch)
{
    int *ks = (int *)scratch;
    int w0neg = 0, w0pos = 0;
    if (start == 1)
        for (int n = 0; n < R; n++) {
            const double w = wp[(size_t)(n / MV_NR) * C * MV_NR + n % MV_NR];
            w0neg |= signbit(w) != 0;
            w0pos |= !signbit(w);
        }
    int r = r0;
    for (; r + MV_FWD_MR <= r1; r += MV_FWD_MR)
        ISA(fwd_tile)(wp, hp, R, C, start, skip, X + r * ldx, ldx, Y + r * ldy, ldy, MV_FWD_MR, ks,
                        w0neg, w0pos);
    for (; r < r1; r++)
        ISA(fwd_tile)(wp, hp, R, C, start, skip, X + r * ldx, ldx, Y + r * ldy, ldy, 1, ks, w0neg, w0pos);
}

/* Gradient of x: tiles of MR rows x 16 inputs; the neurons j (in the
 * interpreter's order) where any row's gy is nonzero are listed once, with
 * the rows' gy values gathered. */
static void
ISA(bgx_tile)(const double *RESTRICT wq, const int *perm, int R, int C, int skip, const double *GY,
                long ldgy, double *GX, long ldgx, int MR, int *js, double *gs)
{
    enum { NK = MV_BGX_NK };
    const int nq = (C + NK - 1) / NK;
    int n = 0;
    for (int j = 0; j < R; j++) {           /* branch-free append */
        const int nn = perm[j];
        int any = !skip;
        for (int m = 0; m < MR; m++) {
            gs[n * MR + m] = GY[m * ldgy + nn];
            any |= GY[m * ldgy + nn] != 0.0;
        }
        js[n] = j;
        n += any;
    }
    for (int q = 0; q < nq; q++) {
        const double *RESTRICT w0 = wq + (size_t)q * R * NK;
        const int e = mv_min(C - q * NK, NK);
#ifdef VEC
        if (MR == MV_BGX_MR) {
            enum { M = MV_BGX_MR, NV = NK / 8 };
            V8 a[M][NV];
            UNROLL for (int m = 0; m < M; m++) {
                double *gx = GX + m * ldgx + q * NK;
                if (e == NK) {
                    UNROLL for (int v = 0; v < NV; v++) a[m][v] = LDU(gx + 8 * v);
                } else {
                    double t[NK] ALIGN64;
                    memset(t, 0, sizeof t);
                    memcpy(t, gx, sizeof(double) * e);
                    UNROLL for (int v = 0; v < NV; v++) a[m][v] = LD(t + 8 * v);
                }
            }
            for (int i = 0; i < n; i++) {
                const double *RESTRICT wj = w0 + (size_t)js[i] * NK;
                const double *RESTRICT gi = gs + i * M;
                V8 wv[NV];
                UNROLL for (int v = 0; v < NV; v++) wv[v] = LD(wj + 8 * v);
                UNROLL for (int m = 0; m < M; m++) {
                    const double gb = gi[m];
                    UNROLL for (int v = 0; v < NV; v++) MADD(a[m][v], wv[v], gb);
                }
            }
            UNROLL for (int m = 0; m < M; m++) {
                double *gx = GX + m * ldgx + q * NK;
                if (e == NK) {
                    UNROLL for (int v = 0; v < NV; v++) STU(gx + 8 * v, a[m][v]);
                } else {
                    double t[NK] ALIGN64;
                    UNROLL for (int v = 0; v < NV; v++) ST(t + 8 * v, a[m][v]);
                    memcpy(gx, t, sizeof(double) * e);
                }
            }
            continue;
        }
#endif
        for (int m = 0; m < MR; m++) {      /* plain C, and leftover rows */
            double a[NK];
            double *gx = GX + m * ldgx + q * NK;
            for (int i = 0; i < e; i++)
                a[i] = gx[i];
            for (int i = 0; i < n; i++) {
                const double *wj = w0 + (size_t)js[i] * NK;
                const double gb = gs[i * MR + m];
                for (int k = 0; k < e; k++)
                    a[k] = a[k] + wj[k] * gb;
            }
            for (int i = 0; i < e; i++)
                gx[i] = a[i];
        }
    }
}

static void
ISA(mv_bgx)(const double *wq, const int *perm, int R, int C, int skip, const double *GY, long ldgy,
              double *GX, long ldgx, int r0, int r1, void *scratch)
{
    int *js = (int *)scratch;
    double *gs = (double *)((char *)scratch + mv_align64(sizeof(int) * (R + 16)));
    int r = r0;
    for (; r + MV_BGX_MR <= r1; r += MV_BGX_MR)
        ISA(bgx_tile)(wq, perm, R, C, skip, GY + r * ldgy, ldgy, GX + r * ldgx, ldgx, MV_BGX_MR, js, gs);
    for (; r < r1; r++)
        ISA(bgx_tile)(wq, perm, R, C, skip, GY + r * ldgy, ldgy, GX + r * ldgx, ldgx, 1, js, gs);
}

/* Gradient of W: GW[k*ldgw + n] += x_i[k] * gy_i[n] over the virtual rows
 * i < n_rows in order (a block's rows, and within a row the uses of W in
 * the interpreter's backward order). Tile: 16 inputs of a group x 16
 * neurons. For each group the rows whose 16 x values are not all zero (or
 * whose gy is not finite) are listed once, in order, with the values packed;
 * every 16-neuron panel p0 <= p < p1 then runs over that list. gy rows have
 * room for round16(R) values, zero past R. */
static void
ISA(mv_bgw)(int R, int C, int n_rows, const double *const *xrow, const double *const *gyrow, double *GW,
              long ldgw, const int *groups, int g0, int g1, int p0, int p1, void *scratch)
{
    enum { MK = MV_BGW_MK, NR = MV_NR };
    const int G = g1 - g0;
    if (G <= 0 || p1 <= p0 || n_rows <= 0)
        return;
    int *cnt = (int *)scratch, *list = cnt + G;                       /* list[g * n_rows + i] */
    double *xv = (double *)((char *)scratch + mv_align64(sizeof(int) * (size_t)G * (n_rows + 1)));
    char *gyfin = (char *)(xv + (size_t)G * n_rows * MK);
    for (int r = 0; r < n_rows; r++)
        gyfin[r] = (char)mv_all_finite(gyrow[r], R);
    for (int g = 0; g < G; g++)
        cnt[g] = 0;
    /* 1. one pass over the rows, in order: each group's list of the rows
     *    where any of its x is nonzero (or gy not finite), values packed.
     *    Branch-free: the slot is always written, kept only when listed. */
    for (int r = 0; r < n_rows; r++) {
        const double *x = xrow[r];
        for (int g = 0; g < G; g++) {
            const int *cols = groups + (size_t)(g0 + g) * MK;
            double *d = xv + ((size_t)g * n_rows + cnt[g]) * MK;
            int any = !gyfin[r];
            for (int m = 0; m < MK; m++) {
                const double v = cols[m] >= 0 ? x[cols[m]] : 0.0;
                d[m] = v;
                any |= v != 0.0;              /* NaN != 0: listed */
            }
            list[(size_t)g * n_rows + cnt[g]] = r;
            cnt[g] += any;
        }
    }
    /* 2. each group: every 16-neuron panel over its list */
    for (int g = 0; g < G; g++) {
        const int *ks = groups + (size_t)(g0 + g) * MK;
        const int n = cnt[g];
        const int *lg = list + (size_t)g * n_rows;
        const double *xg = xv + (size_t)g * n_rows * MK;
        for (int p = p0; p < p1; p++) {
#ifdef VEC
            /* BGW_PART inputs at a time (clang: half a group, whose 16
             * accumulators and two gy vectors fit the registers; a whole
             * group's 32 made it spill, 1.85x the time, while gcc is faster
             * with them); each weight still sums its rows in order */
            for (int h = 0; h < MK; h += BGW_PART) {
                V8 a[BGW_PART][2];
                UNROLL for (int m = 0; m < BGW_PART; m++) {
                    const double *gw = GW + (size_t)(ks[h + m] >= 0 ? ks[h + m] : 0) * ldgw + p * NR;
                    a[m][0] = LD(gw);
                    a[m][1] = LD(gw + 8);
                }
                for (int i = 0; i < n; i++) {
                    const double *RESTRICT gr = gyrow[lg[i]] + p * NR;
                    const double *RESTRICT xi = xg + (size_t)i * MK + h;
                    const V8 g0v = LDU(gr), g1v = LDU(gr + 8);
                    UNROLL for (int m = 0; m < BGW_PART; m++) {
                        const double xb = xi[m];
                        MADD(a[m][0], g0v, xb);
                        MADD(a[m][1], g1v, xb);
                    }
                }
                UNROLL for (int m = 0; m < BGW_PART; m++)
                    if (ks[h + m] >= 0) {        /* absent inputs are not stored */
                        double *gw = GW + (size_t)ks[h + m] * ldgw + p * NR;
                        ST(gw, a[m][0]);
                        ST(gw + 8, a[m][1]);
                    }
            }
#else
            for (int m = 0; m < MK; m++) {
                if (ks[m] < 0)
                    continue;
                double *gw = GW + (size_t)ks[m] * ldgw + p * NR;
                double a[NR];
                for (int i = 0; i < NR; i++)
                    a[i] = gw[i];
                for (int i = 0; i < n; i++) {
                    const double *gr = gyrow[lg[i]] + p * NR;
                    const double xb = xg[(size_t)i * MK + m];
                    for (int t = 0; t < NR; t++)
                        a[t] = a[t] + gr[t] * xb;
                }
                for (int i = 0; i < NR; i++)
                    gw[i] = a[i];
            }
#endif
        }
    }
}

/* Gradient of the heads: GH[n] += gy_i[n] over the virtual rows in order;
 * 64 running sums at a time. */
static void
ISA(mv_bgh)(int R, int n_rows, const double *const *gyrow, double *GH)
{
    for (int n0 = 0; n0 < R; n0 += 64) {
        const int e = mv_min(R - n0, 64);
        double t[64] ALIGN64;
        memset(t, 0, sizeof t);
        memcpy(t, GH + n0, sizeof(double) * e);
#ifdef VEC
        if (e == 64) {
            V8 a[8];
            UNROLL for (int v = 0; v < 8; v++) a[v] = LD(t + 8 * v);
            for (int r = 0; r < n_rows; r++) {
                const double *g = gyrow[r] + n0;
                UNROLL for (int v = 0; v < 8; v++) ADDV(a[v], LDU(g + 8 * v));
            }
            UNROLL for (int v = 0; v < 8; v++) ST(t + 8 * v, a[v]);
            memcpy(GH + n0, t, sizeof(double) * e);
            continue;
        }
#endif
        for (int r = 0; r < n_rows; r++) {
            const double *g = gyrow[r] + n0;
            for (int i = 0; i < e; i++)
                t[i] = t[i] + g[i];
        }
        memcpy(GH + n0, t, sizeof(double) * e);
    }
}

static const MatVecKernels ISA(kernels) = {MV_STR(MV_ISA), ISA(mv_fwd), ISA(mv_bgx), ISA(mv_bgw), ISA(mv_bgh)};

#undef VEC
#undef V8
#undef LD
#undef LDU
#undef ST
#undef STU
#undef MULS
#undef MADD
#undef ADDV
#undef UNROLL
#undef BGW_PART
#undef RESTRICT
#undef ALIGN64
#if MV_LEVEL >= 1 && defined(__x86_64__)
#  if defined(__clang__)
#    pragma clang attribute pop
#  else
#    pragma GCC pop_options
#  endif
#endif
