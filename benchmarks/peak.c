/* The machine's ceiling for the MatVec kernels: double multiply-adds per
 * second of a loop that does nothing else, one core and all cores.
 *
 *   cc -O2 -ffp-contract=off -pthread benchmarks/peak.c -o peak && ./peak [threads] [seconds]
 *
 * Each variant adds 16 different products into 16 zmm (AVX-512) or 8 ymm
 * (AVX2) register accumulators, acc = acc + (a * b), products not depending on the
 * accumulators. "mul+add" is what the exact kernels may do (the product
 * rounded, then the sum: two instructions); "fma" is one fused instruction,
 * what a BLAS does (and the interpreter's bits forbid). Where multiplies and
 * adds share the FMA ports (Intel), mul+add peaks at half of fma; where adds
 * have their own pipes (AMD Zen), both are about the same. Prints one line
 * per variant: name threads GMAC/s. bench_peak.py builds and runs it. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#pragma STDC FP_CONTRACT OFF
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

#define ITERS 100000L       /* per timing round (a millisecond or so) */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* This thread's CPU time: a round that other processes interrupt is not
 * charged for their time slices (on a shared machine). */
static double cpu_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* volatile sinks keep the sums alive */
static volatile double sink;

#define BODY16(OP) OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7) \
                   OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14) OP(15)

__attribute__((target("avx512f"), noinline)) static long
avx512_muladd(long iters)
{
    __m512d a[16], x[8], y[2];
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_pd(i);
    for (int i = 0; i < 8; i++) x[i] = _mm512_set1_pd(1.0 + 1e-7 * i);
    y[0] = _mm512_set1_pd(0.9999999);
    y[1] = _mm512_set1_pd(0.9999998);
    for (long it = 0; it < iters; it++) {
        /* 16 different products, recomputed every time (not hoisted) */
        __asm__ volatile("" : "+v"(x[0]), "+v"(x[1]), "+v"(x[2]), "+v"(x[3]), "+v"(x[4]), "+v"(x[5]),
                         "+v"(x[6]), "+v"(x[7]), "+v"(y[0]), "+v"(y[1]));
#define OP(i) a[i] = _mm512_add_pd(a[i], _mm512_mul_pd(x[i & 7], y[i >> 3]));
        BODY16(OP)
#undef OP
    }
    __m512d s = a[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_pd(s, a[i]);
    sink = _mm512_reduce_add_pd(s);
    return iters * 16 * 8;
}

__attribute__((target("avx512f"), noinline)) static long
avx512_fma(long iters)
{
    __m512d a[16], x[8], y[2];
    for (int i = 0; i < 16; i++) a[i] = _mm512_set1_pd(i);
    for (int i = 0; i < 8; i++) x[i] = _mm512_set1_pd(1.0 + 1e-7 * i);
    y[0] = _mm512_set1_pd(0.9999999);
    y[1] = _mm512_set1_pd(0.9999998);
    for (long it = 0; it < iters; it++) {
        /* 16 different products, recomputed every time (not hoisted) */
        __asm__ volatile("" : "+v"(x[0]), "+v"(x[1]), "+v"(x[2]), "+v"(x[3]), "+v"(x[4]), "+v"(x[5]),
                         "+v"(x[6]), "+v"(x[7]), "+v"(y[0]), "+v"(y[1]));
#define OP(i) a[i] = _mm512_fmadd_pd(x[i & 7], y[i >> 3], a[i]);
        BODY16(OP)
#undef OP
    }
    __m512d s = a[0];
    for (int i = 1; i < 16; i++) s = _mm512_add_pd(s, a[i]);
    sink = _mm512_reduce_add_pd(s);
    return iters * 16 * 8;
}

__attribute__((target("avx2,fma"), noinline)) static long
avx2_muladd(long iters)
{
    __m256d a[8], x[4], y[2];
    for (int i = 0; i < 8; i++) a[i] = _mm256_set1_pd(i);
    for (int i = 0; i < 4; i++) x[i] = _mm256_set1_pd(1.0 + 1e-7 * i);
    y[0] = _mm256_set1_pd(0.9999999);
    y[1] = _mm256_set1_pd(0.9999998);
    for (long it = 0; it < iters; it++) {
        __asm__ volatile("" : "+x"(x[0]), "+x"(x[1]), "+x"(x[2]), "+x"(x[3]), "+x"(y[0]), "+x"(y[1]));
#define OP(i) a[i] = _mm256_add_pd(a[i], _mm256_mul_pd(x[i & 3], y[i >> 2]));
        OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7)
#undef OP
    }
    __m256d s = a[0];
    for (int i = 1; i < 8; i++) s = _mm256_add_pd(s, a[i]);
    double t[4];
    _mm256_storeu_pd(t, s);
    sink = t[0] + t[1] + t[2] + t[3];
    return iters * 8 * 4;
}

__attribute__((target("avx2,fma"), noinline)) static long
avx2_fma(long iters)
{
    __m256d a[8], x[4], y[2];
    for (int i = 0; i < 8; i++) a[i] = _mm256_set1_pd(i);
    for (int i = 0; i < 4; i++) x[i] = _mm256_set1_pd(1.0 + 1e-7 * i);
    y[0] = _mm256_set1_pd(0.9999999);
    y[1] = _mm256_set1_pd(0.9999998);
    for (long it = 0; it < iters; it++) {
        __asm__ volatile("" : "+x"(x[0]), "+x"(x[1]), "+x"(x[2]), "+x"(x[3]), "+x"(y[0]), "+x"(y[1]));
#define OP(i) a[i] = _mm256_fmadd_pd(x[i & 3], y[i >> 2], a[i]);
        OP(0) OP(1) OP(2) OP(3) OP(4) OP(5) OP(6) OP(7)
#undef OP
    }
    __m256d s = a[0];
    for (int i = 1; i < 8; i++) s = _mm256_add_pd(s, a[i]);
    double t[4];
    _mm256_storeu_pd(t, s);
    sink = t[0] + t[1] + t[2] + t[3];
    return iters * 8 * 4;
}

typedef long (*Variant)(long);
typedef struct { Variant f; double seconds; double macs; } Job;

static void *
run(void *arg)
{
    Job *j = (Job *)arg;
    double t0 = now(), macs = 0, best = 0;
    j->f(ITERS / 10);                       /* warm up (clocks, licences) */
    while (now() - t0 < j->seconds) {       /* best round: others share this machine */
        double r0 = cpu_now();
        long m = j->f(ITERS);
        double rate = m / (cpu_now() - r0);
        macs += m;
        if (rate > best)
            best = rate;
    }
    j->macs = best;
    return NULL;
}

static double
rate(Variant f, int threads, double seconds)
{
    pthread_t tid[256];
    Job jobs[256];
    double total = 0;
    for (int t = 0; t < threads; t++) {
        jobs[t].f = f;
        jobs[t].seconds = seconds;
        pthread_create(&tid[t], NULL, run, &jobs[t]);
    }
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        total += jobs[t].macs;
    }
    return total / 1e9;
}

int
main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    double seconds = argc > 2 ? atof(argv[2]) : 0.3;
    __builtin_cpu_init();
    struct { const char *name; const char *need; Variant f; } v[] = {
        {"avx512 mul+add", "avx512f", avx512_muladd}, {"avx512 fma", "avx512f", avx512_fma},
        {"avx2 mul+add", "avx2", avx2_muladd}, {"avx2 fma", "fma", avx2_fma},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        int ok = strcmp(v[i].need, "avx512f") == 0 ? __builtin_cpu_supports("avx512f")
               : strcmp(v[i].need, "avx2") == 0 ? __builtin_cpu_supports("avx2") : __builtin_cpu_supports("fma");
        if (!ok)
            continue;
        for (int t = 1; t <= threads; t = t == threads ? threads + 1 : threads)
            printf("%s\t%d\t%.2f\n", v[i].name, t, rate(v[i].f, t, seconds));
    }
    return 0;
}
