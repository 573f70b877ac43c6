/* ---- every translation unit: headers and the floating-point contract ---- */
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__) && !defined(__TINYC__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

/* IEEE double semantics, whatever the flags: no fast-math (an error), no
 * contraction of a * b + c into an FMA (the pragmas), no reassociation. */
#if defined(__FAST_MATH__) || (defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__) || \
    defined(__ASSOCIATIVE_MATH__) || defined(__RECIPROCAL_MATH__) || defined(__NO_SIGNED_ZEROS__)
#error "nn.c must not be built with -ffast-math, -Ofast or their parts: the results would differ from the interpreter's"
#endif
#pragma STDC FP_CONTRACT OFF
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__) && !defined(__TINYC__)
#pragma GCC optimize ("fp-contract=off")
#endif

#if defined(__GNUC__) && !defined(__TINYC__)
#define NOINLINE __attribute__((noinline))
#define HIDDEN __attribute__((visibility("hidden")))
#else
#define NOINLINE
#define HIDDEN
#endif

/* The widest vector instructions this CPU lets the loops use: 2 AVX-512, 1
 * AVX2, 0 the baseline; $MICROGRAD_KERNELS=base|avx2 asks for less (every
 * level gives the same bits). For the MatVec kernels and the optimizer. */
#if defined(__x86_64__) && !defined(__TINYC__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_VECTOR_LEVEL 1
__attribute__((unused)) static int
vector_level(void)
{
    const char *want = getenv("MICROGRAD_KERNELS");
    __builtin_cpu_init();
    int level = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") ? 2
              : __builtin_cpu_supports("avx2") ? 1 : 0;
    if (want && strcmp(want, "base") == 0)
        level = 0;
    else if (want && strcmp(want, "avx2") == 0 && level > 1)
        level = 1;
    return level;
}
#endif
