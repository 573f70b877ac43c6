/* ---- the loop kernels: what every instruction set shares ------------------ */

/* The loops of kernels_body.c are built once per instruction set, each name
 * with that set's suffix: ISA(fwd_tile) is fwd_tile_avx512 under MV_ISA avx512. */
#define MV_PASTE_(a, b) a##_##b
#define MV_PASTE(a, b) MV_PASTE_(a, b)
#define ISA(name) MV_PASTE(name, MV_ISA)
#define MV_STR_(x) #x
#define MV_STR(x) MV_STR_(x)

static size_t mv_align64(size_t n) { return (n + 63) & ~(size_t)63; }
static int mv_min(int a, int b) { return a < b ? a : b; }
static int mv_max(int a, int b) { return a > b ? a : b; }

/* The multiply-adds the loops ran (terms x lanes that hold outputs, after
 * skipping zeros): forward, input gradient, weight gradient. For the
 * benchmarks (the module's kernel_macs() reads and clears them); counted
 * once per loop call, nothing per term. */
HIDDEN unsigned long long mv_macs[3];
#if defined(__GNUC__) && !defined(__TINYC__)
#define MV_COUNT(kind, n) __atomic_fetch_add(&mv_macs[kind], (unsigned long long)(n), __ATOMIC_RELAXED)
#else
#define MV_COUNT(kind, n) (mv_macs[kind] += (unsigned long long)(n))
#endif

HIDDEN int
mv_all_finite(const double *v, long n)
{
    for (long i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return 0;
    return 1;
}
