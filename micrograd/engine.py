"""A scalar reverse-mode autograd engine: the reference for the compiler.

Every op is defined here with its derivative right beside it. The compiler
(``compiler/ir.py`` names each op, ``compiler/codegen/scalar.py`` renders
its forward and backward C) emits C that performs the same IEEE double
operations in the same order, so compiled forward values and gradients equal the ones
computed here exactly.

Floating-point edge cases follow IEEE-754 the way C does, rather than raising
as Python does: ``log(0)`` is ``-inf``, ``x / 0.0`` is ``±inf`` (or ``nan`` for
``0 / 0``), ``exp(1000)`` is ``inf``, ``0.0 ** -1`` is ``inf``. See
``micrograd/ieee.py``.
"""
import contextlib
import gc
import numbers

from micrograd import ieee


def topological_order(roots, visited=None):
    """Nodes reachable from ``roots`` in depth-first post-order.

    Children are visited in ``_prev`` order, roots in the given order, so the
    order is deterministic. It equals the classic recursive ``build_topo`` of
    micrograd, but uses an explicit stack so that deep graphs cannot hit the
    recursion limit. Both ``backward()`` and the compiler's tracer use it: the
    compiled backward pass accumulates gradients in exactly this order.
    Nodes already in ``visited`` (which is updated) are left out.
    """
    order = []
    visited = set() if visited is None else visited
    for root in roots:
        if root in visited:
            continue
        visited.add(root)
        stack = [(root, iter(root._prev))]
        while stack:
            node, children = stack[-1]
            for child in children:
                if child not in visited:
                    visited.add(child)
                    stack.append((child, iter(child._prev)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


@contextlib.contextmanager
def gc_paused():
    """Build, compile or run a large graph without Python's cyclic garbage collector.

    A ``Value`` graph has no reference cycles (a node holds its operands,
    never the reverse, and no closures), so reference counting frees it.
    Yet the collector scans young objects every few hundred allocations and,
    as the graph grows, all of it again: building microgpt's graph at
    n_embd 64, 4 layers (6.5 million nodes) takes 24 s with it and 4 s
    without. Nodes made inside and still alive at the end are scanned once
    by the next collection (about as long as building them); a graph dropped
    inside the block is never scanned. Nesting is fine: the collector's
    previous state comes back at the end.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Value:
    """A scalar in an expression graph, with the gradient of the last backward.

    ``_prev`` is an ordered tuple of the operands (never a set: operand order
    decides the order of the generated code). ``_op`` names the operation and
    ``_arg`` holds its numeric parameter (the exponent of ``**``).
    """

    __slots__ = ('_data', 'grad', '_prev', '_op', '_arg', '_backward', 'label')
    __array_ufunc__ = None  # make numpy scalars defer to __radd__ and friends

    def __init__(self, data, _children=(), _op='', _arg=None, label='', _backward=None):
        self._data = float(data)
        self.grad = 0.0
        self._prev = _children if type(_children) is tuple else tuple(_children)
        self._op = _op
        self._arg = _arg
        # The op's derivative, a function of the result node: no closure, so a
        # graph holds no reference cycles and frees as soon as it is dropped.
        self._backward = _backward or _no_backward
        self.label = label

    @property
    def data(self):
        """The value, always a Python float: the interpreter computes in
        float64, as the compiled code does."""
        return self._data

    @data.setter
    def data(self, x):
        if type(x) is not float:
            if isinstance(x, bool) or not isinstance(x, numbers.Real):
                raise TypeError(f"Value.data must be a real number, not {type(x).__name__} {x!r:.60}")
            x = float(x)     # a numpy float32 would make the interpreter compute in float32
        self._data = x

    def __repr__(self):
        return f"Value(data={self._data!r}, grad={self.grad!r})"

    # -- binary arithmetic -------------------------------------------------

    def __add__(self, other):
        if type(other) is not Value:
            other = _as_value(other)
            if other is NotImplemented:
                return other
        return _result(self._data + other._data, (self, other), '+', Value._add_backward)

    @staticmethod
    def _add_backward(out):
        a, b = out._prev
        a.grad += out.grad
        b.grad += out.grad

    def __sub__(self, other):
        if type(other) is not Value:
            other = _as_value(other)
            if other is NotImplemented:
                return other
        return _result(self._data - other._data, (self, other), '-', Value._sub_backward)

    @staticmethod
    def _sub_backward(out):
        a, b = out._prev
        a.grad += out.grad
        b.grad += -out.grad

    def __mul__(self, other):
        if type(other) is not Value:
            other = _as_value(other)
            if other is NotImplemented:
                return other
        return _result(self._data * other._data, (self, other), '*', Value._mul_backward)

    @staticmethod
    def _mul_backward(out):
        a, b = out._prev
        a.grad += b._data * out.grad
        b.grad += a._data * out.grad

    def __truediv__(self, other):
        if type(other) is not Value:
            other = _as_value(other)
            if other is NotImplemented:
                return other
        return _result(ieee.div(self._data, other._data), (self, other), '/', Value._div_backward)

    @staticmethod
    def _div_backward(out):
        a, b = out._prev
        # d(a/b)/da = 1/b;  d(a/b)/db = -a/b**2 = -(a/b)/b.
        a.grad += ieee.div(out.grad, b._data)
        b.grad += ieee.div(-(out.grad * out._data), b._data)

    def __radd__(self, other):
        other = _as_value(other)
        return other if other is NotImplemented else other + self

    def __rsub__(self, other):
        other = _as_value(other)
        return other if other is NotImplemented else other - self

    def __rmul__(self, other):
        other = _as_value(other)
        return other if other is NotImplemented else other * self

    def __rtruediv__(self, other):
        other = _as_value(other)
        return other if other is NotImplemented else other / self

    def max(self, other):
        """The larger of ``self`` and ``other``: ``self if self >= other else other``.

        Ties go to ``self`` (the first argument), so only it receives the
        gradient; a NaN comparison is false, so ``other`` is chosen. This is
        C's ``a >= b ? a : b``.
        """
        other = _as_value(other)
        if other is NotImplemented:
            raise TypeError(f"max() needs a Value or a real number, not {type(other).__name__}")
        first = self._data >= other._data
        return _result(self._data if first else other._data, (self, other), 'max', Value._max_backward)

    @staticmethod
    def _max_backward(out):
        a, b = out._prev
        if a._data >= b._data:
            a.grad += out.grad
        else:
            b.grad += out.grad

    # -- unary ops ---------------------------------------------------------

    def __neg__(self):
        return _result(-self._data, (self,), 'neg', Value._neg_backward)

    @staticmethod
    def _neg_backward(out):
        a, = out._prev
        a.grad += -out.grad

    def __pow__(self, k):
        if isinstance(k, Value) or not isinstance(k, numbers.Real):
            return NotImplemented  # exponents are constants, not graph nodes
        k = float(k)
        return _result(ieee.pow(self._data, k), (self,), '**', Value._pow_backward, k)

    @staticmethod
    def _pow_backward(out):
        a, = out._prev
        k = out._arg
        # d(x**k)/dx = k * x**(k-1)
        a.grad += (k * ieee.pow(a._data, k - 1.0)) * out.grad

    def relu(self):
        return _result(0.0 if self._data < 0 else self._data, (self,), 'relu', Value._relu_backward)

    @staticmethod
    def _relu_backward(out):
        a, = out._prev
        # The derivative at 0 is taken as 0 (the output is not > 0).
        a.grad += (out._data > 0) * out.grad

    def tanh(self):
        return _result(ieee.tanh(self._data), (self,), 'tanh', Value._tanh_backward)

    @staticmethod
    def _tanh_backward(out):
        a, = out._prev
        # d tanh(x)/dx = 1 - tanh(x)**2
        a.grad += (1.0 - out._data * out._data) * out.grad

    def exp(self):
        return _result(ieee.exp(self._data), (self,), 'exp', Value._exp_backward)

    @staticmethod
    def _exp_backward(out):
        a, = out._prev
        a.grad += out._data * out.grad

    def log(self):
        return _result(ieee.log(self._data), (self,), 'log', Value._log_backward)

    @staticmethod
    def _log_backward(out):
        a, = out._prev
        a.grad += ieee.div(out.grad, a._data)

    def sigmoid(self):
        return _result(1.0 / (1.0 + ieee.exp(-self._data)), (self,), 'sigmoid', Value._sigmoid_backward)

    @staticmethod
    def _sigmoid_backward(out):
        a, = out._prev
        # d s(x)/dx = s(x) * (1 - s(x))
        a.grad += (out._data * (1.0 - out._data)) * out.grad

    # -- reverse mode --------------------------------------------------------

    def backward(self):
        """Set ``d self / d node`` on every node of the graph below ``self``.

        Interior nodes start from zero on every call; leaves (parameters,
        inputs) accumulate across calls until their ``grad`` is reset, as in
        PyTorch. A node reached along several paths gets the sum of them.
        """
        order = topological_order([self])
        for node in order:
            if node._prev:
                node.grad = 0.0
        self.grad = 1.0
        for node in reversed(order):
            node._backward(node)


def _no_backward(node):
    pass


_new = object.__new__


def _result(data, children, op, backward, arg=None):
    """An op's result: what ``Value(data, children, op, arg,
    _backward=backward)`` makes, without its conversions (``data`` is a
    float, ``children`` a tuple). Ops make millions of nodes: keyword
    arguments and the checks were a third of the cost of ``a + b`` (366 ->
    241 ns). It sets every slot ``__init__`` sets (tests/test_engine.py
    checks that the two agree)."""
    v = _new(Value)
    v._data = data
    v.grad = 0.0
    v._prev = children
    v._op = op
    v._arg = arg
    v._backward = backward
    v.label = ''
    return v


class Constant(Value):
    """A number an op wrapped into the graph (the ``2`` of ``x * 2``): a
    constant of the compiled program, never a leaf the user forgot to list."""
    __slots__ = ()


def _as_value(x):
    if isinstance(x, Value):
        return x
    if type(x) is float or type(x) is int or isinstance(x, numbers.Real):   # (the ABC check is slow)
        return Constant(x)
    return NotImplemented


def max(a, b):
    """``a.max(b)`` for Values or numbers: ties go to ``a``."""
    a = _as_value(a)
    if a is NotImplemented:
        raise TypeError("max() needs Values or real numbers")
    return a.max(b)
