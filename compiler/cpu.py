"""Which instruction sets of the loop kernels a build on this machine needs.

The loop kernels are built once per instruction set
(``templates/kernels_body.c``), and a module picks one when it loads
(``templates/kernels_choose.c``): the widest this CPU runs, no wider than
``$MICROGRAD_KERNELS`` asks. A module built and cached here needs that one
set, not the sets this CPU never picks: its cache key names the set, so a
process whose ``$MICROGRAD_KERNELS`` asks for another builds a module of
its own (a module file loaded there directly refuses to load). The
kernels' unit is most of the first compile on a cold cache (clang -O2, AMD
EPYC Zen 4: 0.97 s with every set, 0.71 s without AVX2's, 0.49 s with
AVX-512's alone). Where the CPU's flags cannot be read, every set is built,
the baseline too, as an exported ``nn.c`` has them.
"""
import functools
import os
import platform

from compiler.constants import KERNELS

# The vector sets of the loops, widest first; then every set, the baseline last.
VECTOR_SETS = tuple(reversed(KERNELS[1:]))
ALL_SETS = VECTOR_SETS + (KERNELS[0],)
# The CPU flags (Linux's /proc/cpuinfo names) each vector set needs: the
# same tests as the C's vector_level() (templates/contract.h)
_NEEDS = {'avx512': {'avx512f', 'avx512vl', 'avx512bw', 'avx512dq'}, 'avx2': {'avx2'}}


def kernel_sets(request=None):
    """The instruction sets (of ``ALL_SETS``) a module built for this
    machine carries: the widest vector set the CPU has, capped by
    ``request`` (a value of ``$MICROGRAD_KERNELS``; None: read it), or the
    baseline where none is left; all of them where the CPU's flags are
    unknown or the request is no set's name (loading refuses it)."""
    if request is None:
        request = os.environ.get('MICROGRAD_KERNELS', '')
    flags = cpu_flags()
    if flags is None or request not in ('', *KERNELS):
        return ALL_SETS
    return sets_for(flags, request) or (KERNELS[0],)


def sets_for(flags, request=''):
    """The widest vector set whose flags are all in ``flags`` and that is no
    wider than ``request`` (``''``: no limit), as a tuple of at most one."""
    allowed = VECTOR_SETS if not request else VECTOR_SETS[VECTOR_SETS.index(request):] \
        if request in VECTOR_SETS else ()
    return next(((s,) for s in allowed if _NEEDS[s] <= flags), ())


@functools.lru_cache(maxsize=None)
def cpu_flags():
    """This CPU's flags (a frozenset), or None where they cannot be read
    (not Linux on x86-64)."""
    if platform.machine().lower() not in ('x86_64', 'amd64'):
        return None
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('flags'):
                    return frozenset(line.split(':', 1)[1].split())
    except OSError:
        pass
    return None
