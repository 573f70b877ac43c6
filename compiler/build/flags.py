"""Flags, optimisation levels and timeouts.

Flags: a list of strings, one flag each (a single string is refused with a
``TypeError``: ``shlex.split`` it). ``flags=`` replaces the defaults, which
keep IEEE semantics (no fast-math, no contraction into FMA); ``opt`` is one
of ``OPT_LEVELS`` (``-Ofast`` is refused: it is fast-math). ``native=True``
adds ``-march=native``.

Timeout: seconds (``float('inf')``: none), default ``$MICROGRAD_CC_TIMEOUT``
or 600.
"""
import math
import numbers
import os
import warnings

TIMEOUT_FALLBACK = 600.0


def _timeout_from_environment():
    """``$MICROGRAD_CC_TIMEOUT`` in seconds (``inf``: none); a value that is not
    a positive number warns and gives 600, so that ``import compiler`` works."""
    text = os.environ.get('MICROGRAD_CC_TIMEOUT', '').strip()
    if not text:
        return TIMEOUT_FALLBACK
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value <= 0:
        warnings.warn(f"MICROGRAD_CC_TIMEOUT={text!r} is not a positive number of seconds: "
                      f"using {TIMEOUT_FALLBACK:g} s", UserWarning, stacklevel=2)
        return TIMEOUT_FALLBACK
    return value


DEFAULT_TIMEOUT = _timeout_from_environment()


# The level that trains fastest with each compiler (benchmarks/bench_mnist.py):
# gcc 12 vectorizes loops only at -O3.
DEFAULT_OPT = {'clang': '-O2', 'gcc': '-O3'}
# -Ofast is not here: it turns on -ffast-math, which reorders and fuses the
# roundings that make the compiled results the interpreter's, bit for bit.
OPT_LEVELS = ('-O0', '-O1', '-O2', '-O3', '-Os', '-Oz', '-Og')


def check_opt(opt):
    """``opt`` if it is ``None`` or one of ``OPT_LEVELS``; else a ``ValueError`` saying what to pass."""
    if opt is None or opt in OPT_LEVELS:
        return opt
    if not isinstance(opt, str):
        raise TypeError(f"opt must be a str such as '-O2', not {type(opt).__name__}")
    if opt == '-Ofast':
        raise ValueError("opt='-Ofast' is refused: it turns on fast-math, which breaks the IEEE "
                         "exactness of the compiled module (its results are the interpreter's, bit "
                         "for bit); use '-O3'")
    hint = f" (did you mean {'-' + opt!r}?)" if '-' + opt in OPT_LEVELS else ''
    raise ValueError(f"opt must be one of {', '.join(OPT_LEVELS)}, not {opt!r}{hint}; other flags "
                     "go in flags=[...], which replaces the default flags")


def check_flags(flags):
    """``flags`` as a new list of str, one flag each; a single string is refused."""
    if isinstance(flags, (str, bytes)):
        raise TypeError(f"flags must be a list of strings, one flag each, not the string {flags!r} "
                        f"(which would be read one character at a time): write "
                        f"flags=shlex.split({flags!r}) or a list such as ['-O2', '-shared', '-fPIC']")
    try:
        flags = list(flags)
    except TypeError:
        raise TypeError(f"flags must be a list of strings, not {type(flags).__name__}") from None
    for flag in flags:
        if not isinstance(flag, str):
            raise TypeError(f"each flag must be a str, not {type(flag).__name__} ({flag!r})")
    return flags


def check_timeout(timeout):
    """Seconds to wait for the compiler, ``None`` for ``float('inf')`` (no limit);
    NaN, zero or negative are a ``ValueError``."""
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}")
    try:
        timeout = float(timeout)
    except OverflowError:              # an int beyond float: as good as no limit
        timeout = math.inf if timeout > 0 else -math.inf
    if math.isnan(timeout) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds (float('inf') for no "
                         f"limit), not {timeout!r}")
    return None if math.isinf(timeout) else timeout


# gcc keeps a loop's array of running sums in registers only once it has
# completely unrolled ("peeled") the loop over that array, by default up to 16
# iterations. The loop kernels keep up to 64 running sums in such unrolled
# loops (independent sums in flight: each is a chain of dependent additions),
# so gcc is told to peel that many.
PEEL_TIMES = 64


def default_flags(toolchain, opt=None, native=False):
    """Flags that keep IEEE double semantics: no fast-math, no FMA contraction.

    ``opt`` is one of ``OPT_LEVELS`` (default: the fastest for the compiler;
    tcc has one level). ``native`` adds ``-march=native`` (opt-in: the build
    then runs only on machines like this one).
    """
    check_opt(opt)
    if toolchain.family == 'tcc':
        return ['-shared', '-fPIC']
    flags = [opt or DEFAULT_OPT[toolchain.family], '-shared', '-fPIC',
             '-ffp-contract=off', '-fno-fast-math', '-w']
    if toolchain.family == 'gcc':
        flags += [f'--param=max-completely-peel-times={PEEL_TIMES}',
                  '--param=max-completely-peeled-insns=2000']
    return flags + ['-march=native'] if native else flags


def are_default_flags(toolchain, flags):
    return any(flags == default_flags(toolchain, opt, native)
               for opt in (None, *OPT_LEVELS) for native in (False, True))
