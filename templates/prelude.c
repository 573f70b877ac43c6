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
