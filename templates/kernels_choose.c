/* The loops this CPU runs best ($MICROGRAD_KERNELS=base|avx2|avx512 asks
 * for one, if the CPU has it): every set gives the same bits. */
HIDDEN const MatVecKernels *
mv_choose_kernels(void)
{
#if defined(__TINYC__) || !(defined(__GNUC__) || defined(__clang__))
    return &kernels_plain;
#else
    const char *want = getenv("MICROGRAD_KERNELS");
    if (want && strcmp(want, "base") == 0)
        return &kernels_base;
#if defined(__x86_64__)
    __builtin_cpu_init();
    const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq");
    const int avx2 = __builtin_cpu_supports("avx2");
    if (avx512 && !(want && strcmp(want, "avx2") == 0))
        return &kernels_avx512;
    if (avx2)
        return &kernels_avx2;
#endif
    return &kernels_base;
#endif
}
