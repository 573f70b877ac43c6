/* ---- optimizer.c: the compiled optimizer's step --------------------------------
 *
 * Its kind and numbers are the prologue's (compiler/codegen/optimizer.py),
 * each formula as PyTorch documents it and in that order of operations
 * (torch.optim.SGD, Adam, AdamW). */
#ifndef NN_AMALGAMATION
#include "state.h"
#endif

#if OPT_KIND == OPT_ADAM || OPT_KIND == OPT_ADAMW
/* Adam: g += wd * p (Adam only); AdamW: p -= lr * wd * p first. Then
 * m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;  mhat = m / (1 - b1^t);
 * vhat = v / (1 - b2^t);  p -= lr mhat / (sqrt(vhat) + eps). ADAM_STEP_BY
 * is one parameter's step on any type with the arithmetic operators: a
 * double, or a vector of them (each lane rounds as the double would: the
 * same bits), SQRT its square root, G the gradient already divided by the
 * divisor, OVER(x, C) the quotient x / C (C1 and C2: the bias corrections,
 * as OVER takes them). */
#define ADAM_STEP_BY(T, SQRT, OVER, P, G, M, S, C1, C2)                                    \
    do {                                                                                   \
        T g_ = (G), p_ = (P);                                                              \
        if (OPT_KIND == OPT_ADAMW && OPT_WEIGHT_DECAY != 0)                                \
            p_ = p_ - lr * OPT_WEIGHT_DECAY * p_;                                          \
        if (OPT_KIND == OPT_ADAM && OPT_WEIGHT_DECAY != 0)                                 \
            g_ = g_ + OPT_WEIGHT_DECAY * p_;                                               \
        const T m_ = OPT_BETA1 * (M) + (1.0 - OPT_BETA1) * g_;                             \
        const T s_ = OPT_BETA2 * (S) + (1.0 - OPT_BETA2) * g_ * g_;                        \
        const T mhat_ = OVER(m_, C1), vhat_ = OVER(s_, C2);                                \
        (M) = m_;                                                                          \
        (S) = s_;                                                                          \
        (P) = p_ - lr * mhat_ / (SQRT(vhat_) + OPT_EPS);                                   \
    } while (0)
#define ADAM_OVER(X, C) ((X) / (C))

/* Returns whether every new p[j] is finite (p - p is 0 for a finite p only:
 * a sum of them is 0, or NaN once one is not). */
static int
adam_scalar(double *restrict p, const double *restrict gp, double *restrict m, double *restrict s,
            double lr, double divisor, double c1, double c2, int j0, int j1)
{
    double z = 0.0;
    for (int j = j0; j < j1; j++) {
        ADAM_STEP_BY(double, sqrt, ADAM_OVER, p[j], gp[j] / divisor, m[j], s[j], c1, c2);
        z += p[j] - p[j];
    }
    return z == 0.0;
}

/* The same steps a vector of parameters at a time (the scalar loop cannot
 * be vectorised by the compiler: sqrt may set errno); returns how many were
 * done, and *finite 0 if a new parameter is not finite (as adam_scalar:
 * free beside the divisions). One function per instruction set, chosen by
 * the state's vector_level (read at load). */
#if defined(HAVE_VECTOR_LEVEL) && !defined(NN_NO_INTRINSICS)
#define ADAM_VECTORS 1
/* The divider bounds these loops: three divisions and a square root a
 * parameter. Two of the divisions are by a number that is the same for
 * every parameter (the batch's divisor, and the bias corrections 1 - b^t),
 * and with an FMA those need not take the divider: with y = 1/c rounded,
 * q = x y, then twice q += (x - c q) y, each remainder x - c q exact in the
 * FMA. The first correction leaves q within an ulp of x / c, the second
 * then rounds it correctly (Markstein's theorem; J.-M. Muller, "Accelerating
 * floating-point division when the divisor is known in advance", 2002), as
 * long as nothing underflows or overflows. So: only for 2^-20 <= c <= 2^20
 * (adam_divisor; otherwise y is 0 and the divider divides), the lanes of x
 * outside [2^-900, 2^900) in magnitude other than the zeros (subnormal,
 * huge, infinite, NaN) by the divider too, and the quotient takes the sign
 * of x (c > 0; the corrections make -0 / c +0). The same bits as x / c:
 * tests/test_optim.py checks every lane of many steps against the division
 * (the first correction alone gave the division's bits on every test run
 * here, 167M quotients by 3,000 corrections; the second is what the proof
 * needs). On the Intel Xeon (model 167) the AVX-512 loop runs 1.75x faster.
 * A division by exactly 1.0 (by the divisor of a batch of one, and by
 * 1 - b1^t once b1^t is below half an ulp of 1: with b1 = 0.85, from step
 * 231; 0.9, from step 356) is left out. */
typedef struct {
    double c, y;        /* the divisor, and 1 / c rounded where the FMA steps apply, else 0 */
} AdamDivisor;

static AdamDivisor
adam_divisor(double c, int fma)
{
    AdamDivisor d = {c, fma && c >= 0x1p-20 && c <= 0x1p20 ? 1.0 / c : 0.0};
    return d;
}

#define ADAM_VECTOR_RUN(NAME, W, G, C1)                                                    \
    for (; j + W <= j1; j += W) {                                                          \
        ADAM_STEP_BY(NAME##_v, NAME##_sqrt, NAME##_over, *(NAME##_v *)(p + j), G,          \
                     *(NAME##_v *)(m + j), *(NAME##_v *)(s + j), C1, d2);                  \
        z += *(NAME##_v *)(p + j) - *(NAME##_v *)(p + j);                                  \
    }
#define G_AT(NAME) (*(const NAME##_v *)(gp + j))
#define ADAM_VECTOR_TYPE(NAME, TARGET, W, SQRT_INTRINSIC, VTYPE)                            \
    typedef double NAME##_v __attribute__((vector_size(W * 8), aligned(8)));               \
    __attribute__((target(TARGET))) static NAME##_v                                        \
    NAME##_sqrt(NAME##_v x) { return (NAME##_v)SQRT_INTRINSIC((VTYPE)x); }
/* x / d.c on the divider */
#define ADAM_DIVIDER_OVER(NAME, TARGET)                                                    \
    __attribute__((target(TARGET))) static inline NAME##_v                                 \
    NAME##_over(NAME##_v x, AdamDivisor d) { return d.c == 1.0 ? x : x / d.c; }
#define ADAM_VECTOR_LOOP(NAME, TARGET, W)                                                  \
    __attribute__((target(TARGET))) static int                                             \
    NAME(double *restrict p, const double *restrict gp, double *restrict m, double *restrict s, \
         double lr, AdamDivisor dg, AdamDivisor d1, AdamDivisor d2, int j0, int j1, int *finite) \
    {                                                                                      \
        int j = j0;                                                                        \
        NAME##_v z = {0};                                                                  \
        const AdamDivisor one = {1.0, 1.0};                                                \
        if (dg.c == 1.0 && d1.c == 1.0)                                                    \
            ADAM_VECTOR_RUN(NAME, W, G_AT(NAME), one)                                      \
        else if (dg.c == 1.0)                                                              \
            ADAM_VECTOR_RUN(NAME, W, G_AT(NAME), d1)                                       \
        else if (d1.c == 1.0)                                                              \
            ADAM_VECTOR_RUN(NAME, W, NAME##_over(G_AT(NAME), dg), one)                     \
        else                                                                               \
            ADAM_VECTOR_RUN(NAME, W, NAME##_over(G_AT(NAME), dg), d1)                      \
        for (int l = 0; l < W; l++)                                                        \
            *finite &= z[l] == 0.0;                                                        \
        return j;                                                                          \
    }
ADAM_VECTOR_TYPE(adam_sse2, "sse2", 2, _mm_sqrt_pd, __m128d)
ADAM_DIVIDER_OVER(adam_sse2, "sse2")
ADAM_VECTOR_LOOP(adam_sse2, "sse2", 2)
ADAM_VECTOR_TYPE(adam_avx, "avx", 4, _mm256_sqrt_pd, __m256d)
ADAM_DIVIDER_OVER(adam_avx, "avx")
ADAM_VECTOR_LOOP(adam_avx, "avx", 4)
ADAM_VECTOR_TYPE(adam_fma, "avx2,fma", 4, _mm256_sqrt_pd, __m256d)
ADAM_VECTOR_TYPE(adam_avx512, "avx512f", 8, _mm512_sqrt_pd, __m512d)

/* The quotient q of x by c from the FMA steps, given the sign of x, and in
 * the lanes the steps may not take (see above) the divider's: 4 lanes ... */
__attribute__((target("avx2,fma"))) static inline __m256d
adam_fma_fix(__m256d x, __m256d c, __m256d q)
{
    const __m256d sign = _mm256_set1_pd(-0.0), a = _mm256_andnot_pd(sign, x);
    q = _mm256_or_pd(q, _mm256_and_pd(sign, x));
    const __m256d ok = _mm256_and_pd(_mm256_or_pd(_mm256_cmp_pd(a, _mm256_set1_pd(0x1p-900), _CMP_GE_OQ),
                                                  _mm256_cmp_pd(a, _mm256_setzero_pd(), _CMP_EQ_OQ)),
                                     _mm256_cmp_pd(a, _mm256_set1_pd(0x1p900), _CMP_LT_OQ));
    return _mm256_movemask_pd(ok) == 0xf ? q : _mm256_blendv_pd(_mm256_div_pd(x, c), q, ok);
}

/* ... 8 lanes */
__attribute__((target("avx512f"))) static inline __m512d
adam_avx512_fix(__m512d x, __m512d c, __m512d q)
{
    const __m512d a = _mm512_abs_pd(x);
    q = _mm512_castsi512_pd(_mm512_or_si512(_mm512_castpd_si512(q),
                                            _mm512_and_si512(_mm512_castpd_si512(x), _mm512_set1_epi64(INT64_MIN))));
    const __mmask8 ok = (_mm512_cmp_pd_mask(a, _mm512_set1_pd(0x1p-900), _CMP_GE_OQ) |
                         _mm512_cmp_pd_mask(a, _mm512_setzero_pd(), _CMP_EQ_OQ)) &
                        _mm512_cmp_pd_mask(a, _mm512_set1_pd(0x1p900), _CMP_LT_OQ);
    return ok == 0xff ? q : _mm512_mask_blend_pd(ok, _mm512_div_pd(x, c), q);
}

/* x / d.c by the FMA steps above (MM: the intrinsics' prefix) */
#define ADAM_FMA_OVER(NAME, TARGET, MM, VTYPE)                                             \
    __attribute__((target(TARGET))) static inline NAME##_v                                 \
    NAME##_over(NAME##_v xv, AdamDivisor d)                                                \
    {                                                                                      \
        if (d.c == 1.0)                                                                    \
            return xv;                                                                     \
        if (d.y == 0.0)                                                                    \
            return xv / d.c;                                                               \
        const VTYPE x = (VTYPE)xv, c = MM##_set1_pd(d.c), y = MM##_set1_pd(d.y);           \
        VTYPE q = MM##_mul_pd(x, y);                                                       \
        q = MM##_fmadd_pd(MM##_fnmadd_pd(c, q, x), y, q);                                  \
        q = MM##_fmadd_pd(MM##_fnmadd_pd(c, q, x), y, q);                                  \
        return (NAME##_v)NAME##_fix(x, c, q);                                              \
    }
ADAM_FMA_OVER(adam_fma, "avx2,fma", _mm256, __m256d)
ADAM_FMA_OVER(adam_avx512, "avx512f", _mm512, __m512d)
ADAM_VECTOR_LOOP(adam_fma, "avx2,fma", 4)
ADAM_VECTOR_LOOP(adam_avx512, "avx512f", 8)
#else
#define ADAM_VECTORS 0
#endif
#endif

/* One step on the gradients gp / divisor for the parameters j0 <= j < j1
 * (each parameter's step is its own: any split of the range gives the same
 * bits). `t` is the step's number, from 1. Returns whether the new
 * parameters are all finite (1 or 0: Adam, which sees them go by), or -1. */
static int
optimizer_range(NNState *st, double lr, double divisor, double t, int j0, int j1)
{
    double *restrict p = st->p;
    const double *restrict gp = st->gp;
#if OPT_KIND == OPT_NONE || (OPT_KIND == OPT_SGD && !OPT_HAS_MOMENTUM && !OPT_HAS_WEIGHT_DECAY)
    for (int j = j0; j < j1; j++)
        p[j] -= lr * (gp[j] / divisor);
    (void)t;
    return -1;
#elif OPT_KIND == OPT_SGD
    /* g += wd * p;  b = g (first step) or momentum * b + g;  g = g + momentum * b
     * (nesterov) or b;  p -= lr * g */
    double *restrict buf = st->state + 1;
    const int first = t == 1.0;
    for (int j = j0; j < j1; j++) {
        double g = gp[j] / divisor;
        if (OPT_WEIGHT_DECAY != 0)
            g = g + OPT_WEIGHT_DECAY * p[j];
        if (OPT_MOMENTUM != 0) {
            buf[j] = first ? g : OPT_MOMENTUM * buf[j] + g;
            g = OPT_NESTEROV ? g + OPT_MOMENTUM * buf[j] : buf[j];
        }
        p[j] = p[j] - lr * g;
    }
    return -1;
#else
    double *restrict m = st->state + 1, *restrict s = st->state + 1 + N_PARAM_SPAN;
    const double c1 = 1.0 - pow(OPT_BETA1, t), c2 = 1.0 - pow(OPT_BETA2, t);
    int j = j0, finite = 1;
#if ADAM_VECTORS
    const int fma = st->vector_level == 2 || (st->vector_level == 1 && __builtin_cpu_supports("fma"));
    const AdamDivisor dg = adam_divisor(divisor, fma), d1 = adam_divisor(c1, fma), d2 = adam_divisor(c2, fma);
    switch (st->vector_level) {
    case 2: j = adam_avx512(p, gp, m, s, lr, dg, d1, d2, j0, j1, &finite); break;
    case 1: j = (fma ? adam_fma : adam_avx)(p, gp, m, s, lr, dg, d1, d2, j0, j1, &finite); break;
    default: j = adam_sse2(p, gp, m, s, lr, dg, d1, d2, j0, j1, &finite);
    }
#endif
    return adam_scalar(p, gp, m, s, lr, divisor, c1, c2, j, j1) && finite;
#endif
}

/* aux from p: every packed copy of the weights, then the rest */
static void
refresh_aux(const double *restrict p, double *restrict aux)
{
    for (int i = 0; i < N_WEIGHT_BLOCKS; i++)
        pack_weights(p, aux, i, -1);
    refresh_rest(p, aux);
}

/* Block i's input-gradient packs, if they lag p: nn_backward_step leaves
 * them to the next forward, which makes them beside its own work (core.c). */
static void
pack_late_block(NNState *st, int i)
{
    if (st->bgx_late[i]) {
        pack_weights_bgx(st->p, st->aux, i);
        st->bgx_late[i] = 0;
    }
}

static void
pack_late(NNState *st)
{
    for (int i = 0; i < N_WEIGHT_BLOCKS; i++)
        pack_late_block(st, i);
}

/* Before anything reads the input-gradient packs (a backward): none lags. */
static void
packs_current(NNState *st)
{
    if (st->bgx_behind)
        pack_late(st);
    st->bgx_behind = 0;
}

/* Every pack was made anew (pack_weights, whole): none lags p. */
static void
all_packed(NNState *st)
{
    st->bgx_behind = 0;
    memset(st->bgx_late, 0, sizeof st->bgx_late);
}

typedef struct {
    NNState *st;
    double lr, divisor, t;
    int zero;       /* zero each gradient once its parameter has stepped (nn_step_zero_grad) */
} OptimizerJob;

/* The step of the parameters [j0, j1), then (o->zero) their gradients zeroed
 * while they are in this thread's cache: step() then zero_grad() in one pass.
 * Returns optimizer_range's finite flag. */
static int
step_range(const OptimizerJob *o, int j0, int j1)
{
    const int finite = optimizer_range(o->st, o->lr, o->divisor, o->t, j0, j1);
    if (o->zero && j1 > j0)
        memset(o->st->gp + j0, 0, sizeof(double) * (size_t)(j1 - j0));
    return finite;
}

/* Steps the other parameters [from, upto) of OTHER_SPANS laid end to end. */
static void
step_other_share(const OptimizerJob *o, long from, long upto)
{
    long at = 0;
    for (int i = 0; i < N_OTHER_SPANS && at < upto; i++) {
        const long n = OTHER_SPANS[i][1] - OTHER_SPANS[i][0];
        long lo = from > at ? from - at : 0, hi = upto - at < n ? upto - at : n;
        if (lo < hi)
            step_range(o, OTHER_SPANS[i][0] + (int)lo, OTHER_SPANS[i][0] + (int)hi);
        at += n;
    }
}

/* How a step's work is dealt when the blocks allow it: block i (heaviest
 * first) to part i % parts, each part stepping its blocks' parameters and
 * packing them while they are in its cache, and the other parameters to
 * the parts in shares that even out the loads. 0 (deal by even ranges,
 * then a barrier, then the packs) when a part's blocks alone would exceed
 * its fair share by more than a quarter. Every part computes the same
 * shares; `share` gets this part's [from, upto) of the other parameters. */
static int
blocks_dealt(int part, int parts, long share[2])
{
    long total_other = 0, below = 0, wanted_below = 0, wanted = 0, worst = 0;
    for (int i = 0; i < N_OTHER_SPANS; i++)
        total_other += OTHER_SPANS[i][1] - OTHER_SPANS[i][0];
    const long total = N_PARAM_SPAN;
    for (int q = 0; q < parts; q++) {
        long load = 0;
        for (int i = q; i < N_WEIGHT_BLOCKS; i += parts)
            load += WEIGHT_SPANS[i][1] - WEIGHT_SPANS[i][0];
        if (load > worst)
            worst = load;
        const long fair = total / parts, missing = load < fair ? fair - load : 0;
        if (q < part)
            wanted_below += missing;
        if (q == part)
            wanted = missing;
        below += missing;
    }
    if (4 * worst > 5 * (total / parts))
        return 0;
    if (below == 0) {       /* every part has its fair share: the rounding's few to the last */
        share[0] = part == parts - 1 ? 0 : total_other;
        share[1] = total_other;
        return 1;
    }
    /* this part's share of the other parameters: its part of what the parts miss */
    share[0] = part == 0 ? 0 : (long)((double)total_other * wanted_below / below) & ~7L;
    share[1] = part == parts - 1 ? total_other
                                 : (long)((double)total_other * (wanted_below + wanted) / below) & ~7L;
    return 1;
}

/* A part's share of the step and of the packs (see blocks_dealt). */
static void
optimizer_job(void *ctx, int part, int parts)
{
    const OptimizerJob *o = (const OptimizerJob *)ctx;
    NNState *st = o->st;
    long share[2];
    if (blocks_dealt(part, parts, share)) {
        for (int i = part; i < N_WEIGHT_BLOCKS; i += parts)
            pack_weights(st->p, st->aux, i, step_range(o, WEIGHT_SPANS[i][0], WEIGHT_SPANS[i][1]));
        step_other_share(o, share[0], share[1]);
        return;
    }
    /* 8-parameter pieces, so that vectors stay whole and aligned */
    const int pieces = (N_PARAM_SPAN + 7) / 8;
    const int j0 = 8 * (int)((long long)pieces * part / parts);
    int j1 = 8 * (int)((long long)pieces * (part + 1) / parts);
    if (j1 > N_PARAM_SPAN)
        j1 = N_PARAM_SPAN;
    step_range(o, j0, j1);
    pool_barrier(&st->pool, parts);
    for (int i = part; i < N_WEIGHT_BLOCKS; i += parts)
        pack_weights(st->p, st->aux, i, -1);
}

/* Below this many parameters, waking the helpers costs more than they save. */
#define MIN_SPLIT_PARAMS 16384

/* One step on the gradients / divisor; zero: the gradients zeroed after it
 * (the same as a memset after, in the same pass). */
static void
optimizer_step(NNState *st, double lr, double divisor, int T, int zero)
{
    OptimizerJob o = {st, lr, divisor, st->state[0] + 1.0, zero};
    if (T > 1 && N_PARAM_SPAN >= MIN_SPLIT_PARAMS)
        pool_run(&st->pool, optimizer_job, &o, T);
    else
        optimizer_job(&o, 0, 1);      /* block by block too: each packed while in cache */
    refresh_rest(st->p, st->aux);
    all_packed(st);
    st->state[0] = o.t;
}
