/* The loops of the module's last load (mv_choose_kernels), which the packs
 * below use: they copy, so every set gives the same panels. */
static const MatVecKernels *mv_packer;

#if defined(__GNUC__) && !defined(__TINYC__)
#define MV_SET_PACKER(k) __atomic_store_n(&mv_packer, (k), __ATOMIC_RELEASE)
#define MV_PACKER() __atomic_load_n(&mv_packer, __ATOMIC_ACQUIRE)
#else
#define MV_SET_PACKER(k) (mv_packer = (k))
#define MV_PACKER() mv_packer
#endif

/* The loops this CPU runs best (vector_level(): $MICROGRAD_KERNELS may ask
 * for fewer) of the sets this unit was built with (MV_HAS_AVX512, MV_HAS_AVX2,
 * MV_HAS_BASE: a build for one machine has only the set its CPU picks), or
 * NULL when they are all wider than that (nn_init refuses the module): every
 * set gives the same bits. */
HIDDEN const MatVecKernels *
mv_choose_kernels(void)
{
    const MatVecKernels *k;
#if defined(__TINYC__) || !(defined(__GNUC__) || defined(__clang__))
    k = &kernels_plain;
#elif defined(HAVE_VECTOR_LEVEL)
    switch (vector_level()) {
    case 2:
#ifdef MV_HAS_AVX512
        k = &kernels_avx512;
        break;
#endif
        /* fall through: the widest set below, as a CPU without AVX-512 */
    case 1:
#ifdef MV_HAS_AVX2
        k = &kernels_avx2;
        break;
#endif
        /* fall through */
    default:
#ifdef MV_HAS_BASE
        k = &kernels_base;
#else
        k = NULL;
#endif
    }
#else
    k = &kernels_base;
#endif
    MV_SET_PACKER(k);
    return k;
}

static const MatVecKernels *
mv_packs(void)
{
    const MatVecKernels *k = MV_PACKER();
    return k != NULL ? k : mv_choose_kernels();
}

/* Forward panels of W by column (RP apart): panels of 64 neurons (the last
 * one round8(R) - 64q wide, padded with 0), in each the neurons of one
 * input k side by side: wp[64q*C + k*nw + i] = W[64q + i][k]. Returns
 * whether every weight it copied is finite (the flag that lets the loops
 * skip zeros), so that W is read once. */
HIDDEN int
mv_pack_fwd(const double *wt, int R, int C, int RP, double *wp)
{
    return mv_packs()->pack_fwd(wt, R, C, RP, wp);
}

/* Input-gradient panels: panels of 64 inputs, W's rows in the interpreter's
 * backward order `perm`: wq[64q*R + j*nw + i] = W[perm[j]][64q + i]. */
HIDDEN void
mv_pack_bgx(const double *wt, const int *perm, int R, int C, int RP, double *wq)
{
    mv_packs()->pack_bgx(wt, perm, R, C, RP, wq);
}
