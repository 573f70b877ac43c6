/* The Conv loops this CPU runs best (vector_level(): $MICROGRAD_KERNELS may
 * ask for fewer); every set gives the same bits. Chosen on first use. */
typedef struct {
    void (*fwd)(const ConvOp *c, const Block *b, int r0, int r1, void *scratch);
    void (*bgx)(const ConvOp *c, const Block *b, int r0, int r1, void *scratch);
    void (*bgw)(const ConvOp *c, const Block *b, int rows, int part, int parts, void *scratch);
} ConvKernels;

#if defined(__TINYC__) || !(defined(__GNUC__) || defined(__clang__))
static const ConvKernels conv_plain = {conv_fwd_plain, conv_bgx_plain, conv_bgw_plain};
static const ConvKernels *
conv_kernels(void)
{
    return &conv_plain;
}
#else
#if defined(__x86_64__)
static const ConvKernels conv_avx512 = {conv_fwd_avx512, conv_bgx_avx512, conv_bgw_avx512};
static const ConvKernels conv_avx2 = {conv_fwd_avx2, conv_bgx_avx2, conv_bgw_avx2};
#endif
static const ConvKernels conv_base = {conv_fwd_base, conv_bgx_base, conv_bgw_base};
static const ConvKernels *
conv_kernels(void)
{
    /* threads may race to set it: each writes the same pointer */
    static const ConvKernels *volatile chosen;
    if (chosen == NULL) {
#if defined(HAVE_VECTOR_LEVEL)
        switch (vector_level()) {
        case 2: chosen = &conv_avx512; break;
        case 1: chosen = &conv_avx2; break;
        default: chosen = &conv_base; break;
        }
#else
        chosen = &conv_base;
#endif
    }
    return chosen;
}
#endif
