/* The loops this CPU runs best (vector_level(): $MICROGRAD_KERNELS may ask
 * for fewer): every set gives the same bits. */
HIDDEN const MatVecKernels *
mv_choose_kernels(void)
{
#if defined(__TINYC__) || !(defined(__GNUC__) || defined(__clang__))
    return &kernels_plain;
#elif defined(HAVE_VECTOR_LEVEL)
    switch (vector_level()) {
    case 2: return &kernels_avx512;
    case 1: return &kernels_avx2;
    default: return &kernels_base;
    }
#else
    return &kernels_base;
#endif
}
