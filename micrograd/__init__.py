"""A scalar autograd interpreter: the reference for everything compiled."""
from micrograd.engine import Value, gc_paused, max, topological_order
from micrograd.losses import cross_entropy, log_softmax, mse, softmax
from micrograd.viz import draw_dot

__all__ = ['Value', 'gc_paused', 'max', 'topological_order', 'softmax', 'log_softmax',
           'cross_entropy', 'mse', 'draw_dot']
