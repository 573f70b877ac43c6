"""IEEE-754 double arithmetic where Python raises instead.

Python raises on ``1.0 / 0.0``, ``math.log(0.0)``, ``math.exp(1000.0)`` and
``math.pow(0.0, -1.0)``; C returns ``inf``, ``-inf`` or ``nan``. The compiled
graph runs in C, so the interpreter must return what C returns, bit for bit.
Every function here calls the same libm routine CPython itself calls for the
ordinary case, and spells out the IEEE result only where Python would raise.
"""
import math

INF = math.inf
NAN = math.nan


def div(x, y):
    """``x / y`` as C computes it: a zero divisor gives ``±inf`` or ``nan``."""
    try:
        return x / y
    except ZeroDivisionError:
        if x == 0.0 or x != x:
            return NAN
        # The sign of the infinity is the xor of the operands' signs,
        # and y is a signed zero here.
        return math.copysign(INF, x) * math.copysign(1.0, y)


def exp(x):
    """``exp(x)``; overflow is ``inf`` (C99 F.10.3.1)."""
    try:
        return math.exp(x)
    except OverflowError:
        return INF


def log(x):
    """``log(x)``; ``log(±0)`` is ``-inf``, ``log(x < 0)`` is ``nan`` (C99 F.10.3.7)."""
    try:
        return math.log(x)
    except ValueError:
        return -INF if x == 0.0 else NAN


def _is_odd_integer(y):
    return math.isfinite(y) and y == math.floor(y) and math.fmod(y, 2.0) != 0.0


def pow(x, y):
    """``pow(x, y)`` with C99 F.10.4.4 results where ``math.pow`` raises."""
    try:
        return math.pow(x, y)
    except OverflowError:
        # |x ** y| is too large; it is negative only for a negative base
        # raised to an odd integer.
        return -INF if x < 0.0 and _is_odd_integer(y) else INF
    except ValueError:
        if x == 0.0:  # pole: pow(±0, y < 0)
            if _is_odd_integer(y):
                return math.copysign(INF, x)
            return INF
        return NAN  # negative base, non-integer exponent


tanh = math.tanh
