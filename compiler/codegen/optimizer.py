"""C of the compiled optimizer: its kind and numbers as constants for the
step in ``compiler/templates/optimizer.c`` (``optimizer_step``), as
lines of the generated prologue."""
from compiler.codegen.scalar import c_double
from compiler.optim import Adam, AdamW, SGD


def uses_intrinsics(optimizer):
    """Its step has vector loops written with immintrin.h (Adam's square roots)."""
    return type(optimizer) in (Adam, AdamW)


def defines(optimizer):
    """The ``#define`` lines describing ``optimizer`` (None: plain SGD with
    the lr of each call)."""
    if optimizer is None:
        return ''
    if type(optimizer) is SGD:
        lines = ['#define OPT_KIND OPT_SGD', '#define OPT_NAME "SGD"',
                 f'#define OPT_MOMENTUM {c_double(optimizer.momentum)}',
                 f'#define OPT_HAS_MOMENTUM {int(optimizer.momentum != 0)}',
                 f'#define OPT_NESTEROV {int(optimizer.nesterov)}']
    elif type(optimizer) in (Adam, AdamW):
        kind = 'OPT_ADAMW' if type(optimizer) is AdamW else 'OPT_ADAM'
        lines = [f'#define OPT_KIND {kind}', f'#define OPT_NAME "{type(optimizer).__name__}"',
                 f'#define OPT_BETA1 {c_double(optimizer.betas[0])}',
                 f'#define OPT_BETA2 {c_double(optimizer.betas[1])}',
                 f'#define OPT_EPS {c_double(optimizer.eps)}', '#define OPT_MOMENTUM 0.0',
                 '#define OPT_HAS_MOMENTUM 0']
    else:
        raise TypeError(f"optimizer must be compiler.SGD, Adam or AdamW, not {type(optimizer).__name__}")
    vectors = 2 if type(optimizer) in (Adam, AdamW) else int(optimizer.momentum != 0)
    lines.append(f'#define OPT_STATE_VECTORS {vectors}   /* Adam: m, v; SGD with momentum: its buffer */')
    return '\n'.join(lines + [f'#define OPT_LR {c_double(optimizer.lr)}',
                              f'#define OPT_WEIGHT_DECAY {c_double(optimizer.weight_decay)}',
                              f'#define OPT_HAS_WEIGHT_DECAY {int(optimizer.weight_decay != 0)}'])
