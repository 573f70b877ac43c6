/* ---- contract.h: every translation unit of nn.c: headers, the floating-point
 * contract, the instruction set the loops may use ------------------------- */
#ifndef NN_CONTRACT_H
#define NN_CONTRACT_H
#ifndef NN_AMALGAMATION
#include "nn_prologue.h"      /* the numbers of one program (codegen writes it first) */
#endif

#ifdef NN_PYTHON
#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>           /* first, as CPython asks */
#endif
#include <math.h>
#ifndef NN_NO_THREADS
#include <pthread.h>
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* Units with no vector intrinsics say NN_NO_INTRINSICS (the straight-line
 * parts; the module's own without Conv loops or Adam): immintrin.h alone
 * costs a compiler 0.1-0.3 s in every unit that reads it. */
#if defined(__x86_64__) && !defined(__TINYC__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(NN_NO_INTRINSICS)
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
#define UNUSED __attribute__((unused))
#else
#define NOINLINE
#define HIDDEN
#define UNUSED
#endif

/* The C API (core.h): hidden inside the Python module, exported by a plain C
 * build (no -DNN_PYTHON: a library for C programs and other languages' FFI). */
#ifndef NN_API
#ifdef NN_PYTHON
#define NN_API HIDDEN
#else
#define NN_API
#endif
#endif

/* The loops of the MatVec ops for one instruction set (kernels_api.c); the
 * module state holds the set chosen at load, each Block carries it. */
typedef struct MatVecKernels MatVecKernels;

/* $MICROGRAD_KERNELS: the instruction set the loops may use at most (every
 * one gives the same bits): 0 base, 1 avx2, 2 avx512; 3 unset or empty (no
 * limit); -1 anything else (nn_init refuses it: a typo must not pass
 * silently). */
UNUSED static int
kernels_request(void)
{
    const char *want = getenv("MICROGRAD_KERNELS");
    if (want == NULL || want[0] == '\0')
        return 3;
    if (strcmp(want, "base") == 0)
        return 0;
    if (strcmp(want, "avx2") == 0)
        return 1;
    if (strcmp(want, "avx512") == 0)
        return 2;
    return -1;
}

/* The widest vector instructions this CPU lets the loops use: 2 AVX-512, 1
 * AVX2, 0 the baseline, no more than $MICROGRAD_KERNELS asks. For the MatVec
 * kernels (mv_choose_kernels) and the optimizer; read once, at load. */
#if defined(__x86_64__) && !defined(__TINYC__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_VECTOR_LEVEL 1
UNUSED static int
vector_level(void)
{
    __builtin_cpu_init();
    int level = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") ? 2
              : __builtin_cpu_supports("avx2") ? 1 : 0;
    const int want = kernels_request();
    return want >= 0 && want < level ? want : level;
}
#endif
#endif
