/* ---- Conv ops: what every instruction set shares ----------------------------
 *
 * A Conv op (compiler/ir.py) is a kernel applied at every position of an
 * image: y[o][p] = h[o] + W[o][k]*x[p][k] + ... over the kernel offsets k
 * whose input x[p][k] exists, ascending. Its tables (generated per op by
 * compiler/codegen/conv.py) say where each number lives: W and h in p (the
 * parameters), x and y in a row. The loops (conv_body.c, built once per
 * instruction set) gather the windows through those tables: no copy of the
 * input per position. */
#ifndef NN_AMALGAMATION
#include "contract.h"
#include "program.h"
#endif

typedef struct {
    int O, OP, K, P;           /* channels (OP: rounded up to 8), offsets, positions */
    const int *w;              /* [O*K]: p index of W[o][k] */
    const int *h;              /* [O]: p index of h[o] */
    const int *x;              /* [P*K]: row index of x[p][k], -1: none (padding) */
    const int *y;              /* [P*O]: row index of y[o][p] at p*O + o */
    int nfull, npart;
    const int *full, *part;    /* positions whose windows are whole, and the others */
    const unsigned char *is_full;   /* [P] */
    const int *rows;           /* input gradient: rows o*P + p by descending rank */
    const int *xg;             /* [P*K]: x's row index where its gradient is needed, else -1 */
    int nx;                    /* the inputs whose gradient is needed: */
    const int *xlist;          /* [nx] their row indices */
    const int *xid;            /* [P*K]: x's index in xlist, else -1 */
    int n_tiles[4];            /* the weight gradient's tiles per instruction set */
    const int *tiles[4];       /* (plain, base, avx2, avx512): k0, tk, v0, ov each */
    int pull;                  /* the input gradient's rows go channel by channel, positions in one order: */
    const int *oorder;         /* [O] the channels in that order */
    const int *jstart;         /* [nx + 1]: where input j's list starts */
    const int *jp, *jk;        /* its positions p (in that order) and the offsets k with x[p][k] = j */
    const int *xk;             /* [K*nfull]: x[full[i]][k] at k*nfull + i (the forward's tiles) */
    int n_ftiles[4];           /* the forward's tiles per instruction set (as tiles): */
    const int *ftiles[4];      /* i0, np (of full[]), v0, ov each */
} ConvOp;

#if defined(__GNUC__) && !defined(__TINYC__)
#define CV_RESTRICT __restrict
#else
#define CV_RESTRICT
#endif
#define CV_PASTE_(a, b) a##_##b
#define CV_PASTE(a, b) CV_PASTE_(a, b)
#define CV_NAME(name) CV_PASTE(name, CV_ISA)
