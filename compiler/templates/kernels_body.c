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
#if MV_LEVEL == 2
#define MV_VMAX 8        /* 32 zmm registers: 8 accumulate */
#elif MV_LEVEL == 1
#define MV_VMAX 4        /* 16 ymm registers: 8 accumulate (two per vector of 8) */
#else
#define MV_VMAX 2
#endif
#define RESTRICT __restrict
#define ALIGN64 __attribute__((aligned(64)))
#define MV_PREFETCH(p) __builtin_prefetch(p)
#define MV_BGW_PREFETCH_BYTES (1 << 20)   /* see mv_bgw */
#else
#define MV_VMAX 8
#define UNROLL
#define RESTRICT
#define ALIGN64
#define MV_PREFETCH(p) ((void)(p))
#define MV_BGW_PREFETCH_BYTES (1 << 20)
#endif

/* The core of every loop below: one tile of V vectors (8V lanes) of
 * independent running sums, acc = init (or B[0] * x0: the first product),
 * then acc = acc + (B[ix[j]] * a[j]) for j < n in order, into out. A list
 * holds only the terms that count (the nonzero a, unless skipping is off),
 * so the work is proportional to them; B is a packed panel (rows ldb
 * doubles apart, 64-byte aligned) small enough to stay in L1 while many
 * lists run over it. Per term: one broadcast, V loads, V multiplies and V
 * adds: on a core whose multiplies and adds share two ports, V >= 4 keeps
 * both ports busy with the loads beside them. */
#ifdef VEC
/* One function per V (a macro: the compilers merge calls of one inline
 * function with different constants before unrolling them). */
#define MV_TILE(V)                                                                                     \
static void                                                                                            \
ISA(tile##V)(const double *init, int first, double x0, const double *RESTRICT B, long ldb,             \
             const int *RESTRICT ix, const double *RESTRICT a, int n, double *out)                     \
{                                                                                                      \
    V8 acc[V];                                                                                         \
    UNROLL for (int v = 0; v < V; v++)                                                                 \
        acc[v] = first ? MULS(LD(B + 8 * v), x0) : LDU(init + 8 * v);                                  \
    for (int j = 0; j < n; j++) {                                                                      \
        const double *RESTRICT b = B + (size_t)ix[j] * ldb;                                            \
        const double s = a[j];                                                                         \
        UNROLL for (int v = 0; v < V; v++)                                                             \
            MADD(acc[v], LD(b + 8 * v), s);                                                            \
    }                                                                                                  \
    UNROLL for (int v = 0; v < V; v++)                                                                 \
        STU(out + 8 * v, acc[v]);                                                                      \
}
MV_TILE(1)
MV_TILE(2)
#if MV_VMAX >= 4
MV_TILE(3)
MV_TILE(4)
#endif
#if MV_VMAX >= 8
MV_TILE(5)
MV_TILE(6)
MV_TILE(7)
MV_TILE(8)
#endif
#undef MV_TILE

#if MV_VMAX >= 8
/* Two rows' lists over one panel of 64 lanes at once: twice the independent
 * sums in flight, one call for both. */
static void
ISA(tile8x2)(const double *initA, const double *initB, const double *RESTRICT B, long ldb,
             const int *RESTRICT ixA, const double *RESTRICT aA, int nA,
             const int *RESTRICT ixB, const double *RESTRICT aB, int nB, double *outA, double *outB)
{
    V8 p[8], q[8];
    UNROLL for (int v = 0; v < 8; v++) {
        p[v] = LDU(initA + 8 * v);
        q[v] = LDU(initB + 8 * v);
    }
    const int n = nA < nB ? nA : nB;
    for (int j = 0; j < n; j++) {
        const double *RESTRICT b = B + (size_t)ixA[j] * ldb, *RESTRICT c = B + (size_t)ixB[j] * ldb;
        const double s = aA[j], t = aB[j];
        UNROLL for (int v = 0; v < 8; v++) {
            MADD(p[v], LD(b + 8 * v), s);
            MADD(q[v], LD(c + 8 * v), t);
        }
    }
    for (int j = n; j < nA; j++) {
        const double *RESTRICT b = B + (size_t)ixA[j] * ldb;
        const double s = aA[j];
        UNROLL for (int v = 0; v < 8; v++)
            MADD(p[v], LD(b + 8 * v), s);
    }
    for (int j = n; j < nB; j++) {
        const double *RESTRICT c = B + (size_t)ixB[j] * ldb;
        const double t = aB[j];
        UNROLL for (int v = 0; v < 8; v++)
            MADD(q[v], LD(c + 8 * v), t);
    }
    UNROLL for (int v = 0; v < 8; v++) {
        STU(outA + 8 * v, p[v]);
        STU(outB + 8 * v, q[v]);
    }
}
#endif

static void
ISA(tile)(int V, const double *init, int first, double x0, const double *B, long ldb,
          const int *ix, const double *a, int n, double *out)
{
    switch (V) {
    case 1: ISA(tile1)(init, first, x0, B, ldb, ix, a, n, out); break;
    case 2: ISA(tile2)(init, first, x0, B, ldb, ix, a, n, out); break;
#if MV_VMAX >= 4
    case 3: ISA(tile3)(init, first, x0, B, ldb, ix, a, n, out); break;
    case 4: ISA(tile4)(init, first, x0, B, ldb, ix, a, n, out); break;
#endif
#if MV_VMAX >= 8
    case 5: ISA(tile5)(init, first, x0, B, ldb, ix, a, n, out); break;
    case 6: ISA(tile6)(init, first, x0, B, ldb, ix, a, n, out); break;
    case 7: ISA(tile7)(init, first, x0, B, ldb, ix, a, n, out); break;
    case 8: ISA(tile8)(init, first, x0, B, ldb, ix, a, n, out); break;
#endif
    }
}
#else
static void
ISA(tile)(int V, const double *init, int first, double x0, const double *B, long ldb,
          const int *ix, const double *a, int n, double *out)
{
    double acc[8 * MV_VMAX];
    for (int i = 0; i < 8 * V; i++)
        acc[i] = first ? B[i] * x0 : init[i];
    for (int j = 0; j < n; j++) {
        const double *b = B + (size_t)ix[j] * ldb;
        const double s = a[j];
        for (int i = 0; i < 8 * V; i++)
            acc[i] = acc[i] + b[i] * s;
    }
    for (int i = 0; i < 8 * V; i++)
        out[i] = acc[i];
}
#endif

/* The terms k in [k0, C) of one row x that count, ascending: their k into
 * ix and x[k] into a (every k unless skip; NaN != 0 counts); returns how
 * many. */
static int
ISA(row_list)(const double *x, int k0, int C, int skip, int *ix, double *a)
{
    int n = 0, k = k0;
    if (!skip) {
        for (; k < C; k++) {
            ix[n] = k;
            a[n++] = x[k];
        }
        return n;
    }
#if MV_LEVEL == 2 && defined(__x86_64__)
    {
        const __m512d z = _mm512_setzero_pd();
        __m256i kv = _mm256_add_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (; k + 8 <= C; k += 8) {
            const __m512d v = _mm512_loadu_pd(x + k);
            const __mmask8 mk = _mm512_cmp_pd_mask(v, z, _CMP_NEQ_UQ);
            /* compress in registers, then store all 8 lanes: the lanes past
             * the count land below position k + 8 - k0 <= C - k0, inside
             * the list's room, and are overwritten or never read. (A
             * compress straight to memory is microcoded on AMD Zen 4: about
             * 44% of a 784-50-10 step.) */
            _mm256_storeu_si256((__m256i *)(ix + n), _mm256_maskz_compress_epi32(mk, kv));
            _mm512_storeu_pd(a + n, _mm512_maskz_compress_pd(mk, v));
            n += __builtin_popcount(mk);
            kv = _mm256_add_epi32(kv, _mm256_set1_epi32(8));
        }
    }
#endif
    for (; k < C; k++) {                    /* branch-free append */
        ix[n] = k;
        a[n] = x[k];
        n += x[k] != 0.0;
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

/* The terms k in [k0, C) of one row x that count (as row_list), listed a
 * block of KC inputs at a time so that where each block's terms start in
 * the list comes for free: off[b] for b <= NB (off[NB] = the count, which
 * it returns). KC is a multiple of 8: only the first block (k0 > 0) and
 * the last have a scalar tail. */
static int
ISA(row_blocks)(const double *x, int k0, int C, int skip, int KC, int NB, int *ix, double *a, int *off)
{
    int n = 0;
    for (int b = 0; b < NB; b++) {
        off[b] = n;
        const int lo = b == 0 ? k0 : b * KC, hi = mv_min(C, (b + 1) * KC);
        if (lo < hi)
            n += ISA(row_list)(x, lo, hi, skip, ix + n, a + n);
    }
    off[NB] = n;
    return n;
}

/* Rows x lanes: out[r][i] (i < e) = a sum over the terms of row r's list in
 * order, started from init; the panel's rows in blocks of KC (each block's
 * B stays in L1 over all the rows; between blocks a row's sums wait in acc).
 * init: 0 hp[i] for every row, 1 B[0][i] * x0[r] (the first product), 2 what
 * out holds. Lanes past e are never stored (out may end there). */
static void
ISA(panel_rows)(int rows, const double *B, int nw, int e, int KC, int NB,
                const int *ix, const double *a, int ldl, const int *off,
                int init, const double *hp, const double *x0, long ldx0,
                double *out, long ldo, double *acc, int kind)
{
    long long terms = 0;
    for (int r = 0; r < rows; r++)
        terms += off[r * (NB + 1) + NB] - off[r * (NB + 1)];
    MV_COUNT(kind, terms * e);
    for (int b = 0; b < NB; b++) {
        const int last = b == NB - 1;
        int r = 0;
#if defined(VEC) && MV_VMAX >= 8
        if (nw == 64 && e == 64 && !(b == 0 && init == 1))   /* whole panels: two rows a call */
            for (; r + 2 <= rows; r += 2) {
                const int *oA = off + r * (NB + 1), *oB = oA + (NB + 1);
                double *outa = out + r * ldo, *outb = outa + ldo;
                double *acca = acc + (size_t)r * MV_PW, *accb = acca + MV_PW;
                const double *fa = b > 0 ? acca : init == 0 ? hp : outa;
                const double *fb = b > 0 ? accb : init == 0 ? hp : outb;
                ISA(tile8x2)(fa, fb, B, nw, ix + (size_t)r * ldl + oA[b], a + (size_t)r * ldl + oA[b],
                             oA[b + 1] - oA[b], ix + (size_t)(r + 1) * ldl + oB[b], a + (size_t)(r + 1) * ldl + oB[b],
                             oB[b + 1] - oB[b], last ? outa : acca, last ? outb : accb);
            }
#endif
        for (; r < rows; r++) {
            const int *o = off + r * (NB + 1);
            const int j0 = o[b], n = o[b + 1] - j0;
            double *o_r = out + r * ldo, *acc_r = acc + (size_t)r * MV_PW;
            for (int s0 = 0; s0 < nw; s0 += 8 * MV_VMAX) {
                const int V = mv_min(MV_VMAX, (nw - s0) / 8), full = s0 + 8 * V <= e;
                const double *from = acc_r + s0;
                int first = 0;
                if (b == 0) {
                    if (init == 0)
                        from = hp + s0;
                    else if (init == 1)
                        first = 1;
                    else if (full)
                        from = o_r + s0;
                    else {              /* out may end at e: only e lanes are read */
                        memset(acc_r + s0, 0, sizeof(double) * 8 * V);
                        memcpy(acc_r + s0, o_r + s0, sizeof(double) * (e - s0));
                    }
                }
                double *to = last && full ? o_r + s0 : acc_r + s0;
                ISA(tile)(V, from, first, first ? x0[r * ldx0] : 0.0, B + s0, nw,
                          ix + (size_t)r * ldl + j0, a + (size_t)r * ldl + j0, n, to);
                if (last && !full)
                    memcpy(o_r + s0, acc_r + s0, sizeof(double) * (e - s0));
            }
        }
    }
}

/* The rows of a chunk, their lists and offsets (scratch of MV_RCH rows). */
typedef struct {
    int *ix, *off;
    double *a, *acc;
} ISA(Lists);

static ISA(Lists)
ISA(lists_in)(void *scratch, int L, int NB)
{
    ISA(Lists) s;
    char *p = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    s.acc = (double *)p;
    p += mv_align64(sizeof(double) * MV_RCH * MV_PW);
    s.a = (double *)p;
    p += mv_align64(sizeof(double) * (size_t)MV_RCH * L);
    s.ix = (int *)p;
    p += mv_align64(sizeof(int) * (size_t)MV_RCH * L);
    s.off = (int *)p;
    (void)NB;
    return s;
}

/* Forward, rows r0 <= r < r1: y = heads + W x for each, over the packed
 * panels of 64 neurons (kernels.c: mv_pack_fwd). Each row lists its own
 * nonzero x (the terms that count): the work follows the nonzeros of each
 * row, not of a tile of rows. start: 0 the heads hp, 1 the first product
 * (k = 0), 2 what Y holds. */
static void
ISA(mv_fwd)(const double *wp, const double *hp, int R, int C, int start, int skip,
            const double *X, long ldx, double *Y, long ldy, int r0, int r1, void *scratch)
{
    const int R8 = (R + 7) & ~7, NP = (R8 + MV_PW - 1) / MV_PW;
    const int KC = mv_max(8, (MV_L1_DOUBLES / mv_min(MV_PW, R8)) & ~7), NB = (C + KC - 1) / KC;
    int w0neg = 0, w0pos = 0;
    if (start == 1)
        for (int n = 0; n < R; n++) {
            const double w = wp[(size_t)(n / MV_PW) * MV_PW * C + n % MV_PW];   /* W[n][0] */
            w0neg |= signbit(w) != 0;
            w0pos |= !signbit(w);
        }
    ISA(Lists) s = ISA(lists_in)(scratch, C, NB);
    for (int c0 = r0; c0 < r1; c0 += MV_RCH) {
        const int rows = mv_min(MV_RCH, r1 - c0);
        for (int r = 0; r < rows; r++) {
            const double *x = X + (c0 + r) * ldx;
            /* a row whose sums may start at -0.0 adds its zeros too */
            const int sk = skip && !(start == 1 && ISA(starts_negative_zero)(x[0], w0neg, w0pos));
            ISA(row_blocks)(x, start == 1, C, sk, KC, NB, s.ix + (size_t)r * C, s.a + (size_t)r * C,
                            s.off + r * (NB + 1));
        }
        for (int q = 0; q < NP; q++) {
            const int n0 = q * MV_PW, nw = mv_min(MV_PW, R8 - n0), e = mv_min(R - n0, nw);
            ISA(panel_rows)(rows, wp + (size_t)n0 * C, nw, e, KC, NB, s.ix, s.a, C, s.off,
                            start, hp ? hp + n0 : NULL, X + c0 * ldx, ldx, Y + c0 * ldy + n0, ldy, s.acc, 0);
        }
    }
}

/* Gradient of x, rows r0 <= r < r1: gx[k] += the sum over the neurons j in
 * the interpreter's backward order of gy[j] * W[j][k], each row listing its
 * own nonzero gy (ReLU's zeros), over panels of 64 inputs (mv_pack_bgx). */
static void
ISA(mv_bgx)(const double *wq, const int *perm, int R, int C, int skip, const double *GY, long ldgy,
            double *GX, long ldgx, int r0, int r1, void *scratch)
{
    const int C8 = (C + 7) & ~7, NP = (C8 + MV_PW - 1) / MV_PW;
    const int JC = mv_max(8, MV_L1_DOUBLES / mv_min(MV_PW, C8)), NB = (R + JC - 1) / JC;
    ISA(Lists) s = ISA(lists_in)(scratch, R, NB);
    for (int c0 = r0; c0 < r1; c0 += MV_RCH) {
        const int rows = mv_min(MV_RCH, r1 - c0);
        for (int r = 0; r < rows; r++) {
            const double *gy = GY + (c0 + r) * ldgy;
            int *ix = s.ix + (size_t)r * R, n = 0;
            double *a = s.a + (size_t)r * R;
            int *off = s.off + r * (NB + 1);
            for (int b = 0; b < NB; b++) {   /* block by block: where each starts comes for free */
                off[b] = n;
                for (int j = b * JC, j1 = mv_min(R, (b + 1) * JC); j < j1; j++) {   /* branch-free append */
                    const double g = gy[perm[j]];
                    ix[n] = j;
                    a[n] = g;
                    n += !skip | (g != 0.0);
                }
            }
            off[NB] = n;
        }
        for (int q = 0; q < NP; q++) {
            const int k0 = q * MV_PW, nw = mv_min(MV_PW, C8 - k0), e = mv_min(C - k0, nw);
            ISA(panel_rows)(rows, wq + (size_t)k0 * R, nw, e, JC, NB, s.ix, s.a, R, s.off,
                            2, NULL, NULL, 0, GX + c0 * ldgx + k0, ldgx, s.acc, 1);
        }
    }
}

#if MV_LEVEL == 2 && defined(__x86_64__)
/* Whether cols[0..7] are the inputs k, k+1, ..., k+7 (a run of a layer's x). */
static inline int
ISA(consecutive8)(const int *cols)
{
    for (int c = 1; c < 8; c++)
        if (cols[c] != cols[0] + c)
            return 0;
    return cols[0] >= 0;
}

/* t[c] = x[0..7][k + c]: 8 rows x 8 inputs, by input, a transpose in
 * registers (pairs, then quads, then halves: 24 shuffles for 64 values). */
static inline void
ISA(transpose8)(const double *const *x, int k, __m512d t[8])
{
    __m512d r[8], lo[4], hi[4];
    for (int i = 0; i < 8; i++)
        r[i] = _mm512_loadu_pd(x[i] + k);
    for (int q = 0; q < 4; q++) {        /* rows 2q, 2q+1: even and odd inputs */
        lo[q] = _mm512_unpacklo_pd(r[2 * q], r[2 * q + 1]);
        hi[q] = _mm512_unpackhi_pd(r[2 * q], r[2 * q + 1]);
    }
    const __m512i s04 = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), s26 = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const __m512i h0 = _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11), h1 = _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15);
    for (int odd = 0; odd < 2; odd++) {
        const __m512d *u = odd ? hi : lo;
        /* rows 0-3 then 4-7 of inputs 0 and 4 (a), 2 and 6 (b); +1 when odd */
        const __m512d a0 = _mm512_permutex2var_pd(u[0], s04, u[1]), a1 = _mm512_permutex2var_pd(u[2], s04, u[3]);
        const __m512d b0 = _mm512_permutex2var_pd(u[0], s26, u[1]), b1 = _mm512_permutex2var_pd(u[2], s26, u[3]);
        t[0 + odd] = _mm512_permutex2var_pd(a0, h0, a1);
        t[4 + odd] = _mm512_permutex2var_pd(a0, h1, a1);
        t[2 + odd] = _mm512_permutex2var_pd(b0, h0, b1);
        t[6 + odd] = _mm512_permutex2var_pd(b0, h1, b1);
    }
}

/* Rows ib..ib+7 onto the lists of 8 inputs (input c's list at ix, a + c *
 * RB, cnt[c] long): the rows where t[c] is nonzero (NaN counts) or whose gy
 * is not finite (the bits of nf). Eight lists at once: their counts do not
 * wait for each other. All 8 lanes are stored: the ones past the count
 * land below ib + 8, inside the list's room. */
static inline void
ISA(append8)(const __m512d t[8], int ib, __mmask8 nf, int *ix, double *a, int *cnt, int RB)
{
    const __m512d z = _mm512_setzero_pd();
    const __m256i iv = _mm256_add_epi32(_mm256_set1_epi32(ib), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int c = 0; c < 8; c++) {
        const __mmask8 mk = _mm512_cmp_pd_mask(t[c], z, _CMP_NEQ_UQ) | nf;
        _mm256_storeu_si256((__m256i *)(ix + (size_t)c * RB + cnt[c]), _mm256_maskz_compress_epi32(mk, iv));
        _mm512_storeu_pd(a + (size_t)c * RB + cnt[c], _mm512_maskz_compress_pd(mk, t[c]));
        cnt[c] += __builtin_popcount(mk);
    }
}
#endif

/* Gradient of W: GW[k*ldgw + n] += x_i[k] * gy_i[n] over the virtual rows
 * i < n_rows in order (a block's rows, and within a row the uses of W in
 * the interpreter's backward order), for the inputs of groups g0 <= g < g1
 * and the neurons of 16-lane panels p0 <= p < p1. The rows go in blocks
 * whose gy (packed, 64 neurons a panel) stay in L1; in each, every input
 * lists the rows where its x is nonzero (or gy not finite), so the work
 * follows the nonzeros of each input. gy rows have room for round16(R)
 * values, zero past R. */
static void
ISA(mv_bgw)(int R, int C, int n_rows, const double *const *xrow, const double *const *gyrow, double *GW,
            long ldgw, const int *groups, int g0, int g1, int p0, int p1, void *scratch)
{
    const int L0 = p0 * MV_NR, L1 = mv_min(p1 * MV_NR, R);
    if (g1 <= g0 || L1 <= L0 || n_rows <= 0)
        return;
    const int W8 = (L1 - L0 + 7) & ~7, NP = (W8 + MV_BGW_PW - 1) / MV_BGW_PW;
    const int RB = mv_min(MV_RB_MAX, MV_L1_DOUBLES / mv_min(MV_BGW_PW, W8));
    char *p = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);   /* after the row pointers */
    double *gyp = (double *)p;                        /* [panel][row][nw] */
    p += mv_align64(sizeof(double) * (size_t)RB * W8);
    double *acc = (double *)p;
    p += mv_align64(sizeof(double) * MV_BGW_PW);
    const int K = (g1 - g0) * MV_BGW_MK;
    double *a = (double *)p;                          /* [input][row] */
    p += mv_align64(sizeof(double) * (size_t)K * RB);
    int *ix = (int *)p;
    p += mv_align64(sizeof(int) * (size_t)K * RB);
    int *cnt = (int *)p;
    p += mv_align64(sizeof(int) * (size_t)K);
    char *gyfin = p;
    const int *cols = groups + (size_t)g0 * MV_BGW_MK;
    (void)C;
    for (int i0 = 0; i0 < n_rows; i0 += RB) {
        const int nb = mv_min(RB, n_rows - i0);
        for (int i = 0; i < nb; i++) {
            const double *g = gyrow[i0 + i] + L0;
            gyfin[i] = (char)mv_all_finite(gyrow[i0 + i], R);
            for (int q = 0; q < NP; q++) {
                const int nw = mv_min(MV_BGW_PW, W8 - q * MV_BGW_PW);
                memcpy(gyp + (size_t)q * MV_BGW_PW * RB + (size_t)i * nw, g + q * MV_BGW_PW, sizeof(double) * nw);
            }
        }
        /* each input's list of the block's rows where its x is nonzero (or
         * the row's gy not finite), in order: 8 rows at a time, each row's
         * cache lines read in order (8 x 8 tiles transposed in registers) */
        for (int c = 0; c < K; c++)
            cnt[c] = 0;
        for (int ib = 0; ib < nb; ib += 8) {
            const int ie = mv_min(8, nb - ib);
#if MV_LEVEL == 2 && defined(__x86_64__)
            __mmask8 nf = 0;
            for (int i = 0; i < ie; i++)
                nf |= (__mmask8)(!gyfin[ib + i] << i);
#endif
            for (int c0 = 0; c0 < K; c0 += 8) {
#if MV_LEVEL == 2 && defined(__x86_64__)
                if (ie == 8 && ISA(consecutive8)(cols + c0)) {
                    __m512d t[8];
                    ISA(transpose8)(xrow + i0 + ib, cols[c0], t);
                    ISA(append8)(t, ib, nf, ix + (size_t)c0 * RB, a + (size_t)c0 * RB, cnt + c0, RB);
                    continue;
                }
#endif
                for (int c = c0; c < c0 + 8; c++) {
                    const int k = cols[c];
                    int *ixc = ix + (size_t)c * RB, n = cnt[c];
                    double *ac = a + (size_t)c * RB;
                    for (int i = ib; i < ib + ie; i++) {   /* branch-free append */
                        const double x = k >= 0 ? xrow[i0 + i][k] : 0.0;
                        ixc[n] = i;
                        ac[n] = x;
                        n += !gyfin[i] | (x != 0.0);   /* NaN != 0: listed */
                    }
                    cnt[c] = n;
                }
            }
        }
        for (int q = 0; q < NP; q++) {
            const int n0 = q * MV_BGW_PW, nw = mv_min(MV_BGW_PW, W8 - n0), e = mv_min(L1 - L0 - n0, nw);
            const double *B = gyp + (size_t)q * MV_BGW_PW * RB;
            long long terms = 0;
            for (int c = 0; c < K; c++)
                terms += cols[c] >= 0 ? cnt[c] : 0;
            MV_COUNT(2, terms * e);
            const int far = (size_t)K * W8 * sizeof(double) > MV_BGW_PREFETCH_BYTES;
            for (int c = 0; c < K; c++) {
                /* where this part of GW is larger than about half of L2 (all of
                 * it passes by once a block), the gradient rows two inputs on
                 * are on the way from L3 while these sums run (784-256: 6-7%
                 * less time, measured on an Intel Xeon; below that size it
                 * only costs instructions) */
                if (far && c + 2 < K && cols[c + 2] >= 0)
                    for (int l = 0; l < nw; l += 8)
                        MV_PREFETCH(GW + (size_t)cols[c + 2] * ldgw + L0 + n0 + l);
                if (cols[c] < 0 || cnt[c] == 0)
                    continue;
                double *gw = GW + (size_t)cols[c] * ldgw + L0 + n0;   /* room for round16(R) */
                for (int s0 = 0; s0 < nw; s0 += 8 * MV_VMAX) {
                    const int V = mv_min(MV_VMAX, (nw - s0) / 8), full = s0 + 8 * V <= e;
                    ISA(tile)(V, gw + s0, 0, 0.0, B + s0, nw, ix + (size_t)c * RB, a + (size_t)c * RB, cnt[c],
                              full ? gw + s0 : acc);
                    if (!full)                /* the padding of GW stays 0 */
                        memcpy(gw + s0, acc, sizeof(double) * (e - s0));
                }
            }
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

/* The packed copies of W (kernels_api.c's layouts), refreshed after every
 * change of the weights: copies, so every instruction set gives the same
 * panels. The forward panels from W by column, each column's neurons
 * side by side (a copy the compiler vectorizes); returns whether every
 * weight copied is finite (w - w is 0 for a finite w only). */
static int
ISA(pack_fwd)(const double *wt, int R, int C, int RP, double *wp)
{
    const int R8 = (R + 7) & ~7;
    int finite = 1;
    for (int n0 = 0; n0 < R8; n0 += MV_PW) {
        const int nw = mv_min(MV_PW, R8 - n0), real = mv_min(nw, R - n0);
        double *q = wp + (size_t)n0 * C;
        for (int k = 0; k < C; k++) {
            const double *RESTRICT w = wt + (size_t)k * RP + n0;
            double *RESTRICT out = q + (size_t)k * nw;
            int ok = 1;
            for (int i = 0; i < real; i++) {
                out[i] = w[i];
                ok &= w[i] - w[i] == 0.0;
            }
            for (int i = real; i < nw; i++)
                out[i] = 0.0;
            finite &= ok;
        }
    }
    return finite;
}

/* Inputs from..real-1 of a panel's row (from k0 on) one weight at a time
 * from W's row at w, read by column (RP apart); zeros past real up to nw. */
static inline void
ISA(pack_bgx_tail)(double *row, const double *w, int k0, int from, int real, int nw, int RP)
{
    for (int i = from; i < real; i++)
        row[i] = w[(size_t)(k0 + i) * RP];
    for (int i = real; i < nw; i++)
        row[i] = 0.0;
}

/* Input-gradient panels: panels of 64 inputs, W's rows in the backward
 * order perm: wq[64q*R + j*nw + i] = W[perm[j]][64q + i]. Row j of a panel
 * is one weight at a time from W's row perm[j]. */
static void
ISA(pack_bgx_rows)(const double *wt, const int *perm, int R, int C, int RP, double *wq)
{
    const int C8 = (C + 7) & ~7;
    for (int k0 = 0; k0 < C8; k0 += MV_PW) {
        const int nw = mv_min(MV_PW, C8 - k0), real = mv_min(nw, C - k0);
        double *q = wq + (size_t)k0 * R;
        for (int j = 0; j < R; j++)
            ISA(pack_bgx_tail)(q + (size_t)j * nw, wt + perm[j], k0, 0, real, nw, RP);
    }
}

#if MV_LEVEL == 2 && defined(__x86_64__)
#define MV_PACK_ROWS 2048   /* W's rows up to which pack_bgx inverts perm on the stack */
#endif

/* The same panels as pack_bgx_rows. AVX-512: W's rows n0..n0+7 (8 weights
 * of each input, one cache line or two) by blocks of 8 inputs, each block
 * an 8 x 8 transpose in registers whose rows are stored at their places in
 * the backward order (where[n]: the j of perm[j] = n), whatever that order
 * (microgpt's q, k and v rows come interleaved); the rows past the last 8
 * and the inputs past the last 8 of a panel one weight at a time. */
static void
ISA(pack_bgx)(const double *wt, const int *perm, int R, int C, int RP, double *wq)
{
#if MV_LEVEL == 2 && defined(__x86_64__)
    if (R <= MV_PACK_ROWS) {
        int where[MV_PACK_ROWS];
        for (int j = 0; j < R; j++)
            where[perm[j]] = j;
        const int C8 = (C + 7) & ~7, R8 = R & ~7;
        for (int k0 = 0; k0 < C8; k0 += MV_PW) {
            const int nw = mv_min(MV_PW, C8 - k0), real = mv_min(nw, C - k0), real8 = real & ~7;
            double *q = wq + (size_t)k0 * R;
            for (int n0 = 0; n0 < R8; n0 += 8)
                for (int i0 = 0; i0 < real8; i0 += 8) {
                    const double *cols[8];
                    __m512d t[8];
                    for (int c = 0; c < 8; c++)
                        cols[c] = wt + (size_t)(k0 + i0 + c) * RP + n0;
                    ISA(transpose8)(cols, 0, t);        /* t[d]: W's row n0 + d, inputs i0..i0+7 */
                    for (int d = 0; d < 8; d++)
                        _mm512_storeu_pd(q + (size_t)where[n0 + d] * nw + i0, t[d]);
                }
            for (int n = 0; n < R; n++)
                ISA(pack_bgx_tail)(q + (size_t)where[n] * nw, wt + n, k0, n < R8 ? real8 : 0, real, nw, RP);
        }
        return;
    }
#endif
    ISA(pack_bgx_rows)(wt, perm, R, C, RP, wq);
}

static const MatVecKernels ISA(kernels) = {MV_STR(MV_ISA), ISA(mv_fwd), ISA(mv_bgx), ISA(mv_bgw), ISA(mv_bgh),
                                           ISA(pack_fwd), ISA(pack_bgx)};

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
#undef MV_VMAX
#undef RESTRICT
#undef ALIGN64
#undef MV_PREFETCH
#undef MV_BGW_PREFETCH_BYTES
#if MV_LEVEL >= 1 && defined(__x86_64__)
#  if defined(__clang__)
#    pragma clang attribute pop
#  else
#    pragma GCC pop_options
#  endif
#endif
