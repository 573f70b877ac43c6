"""Loss functions built from ordinary ``Value`` ops, so the compiler sees them."""
from micrograd.engine import Value


def max_of(values):
    """The largest of ``values``, left to right: ``((v0 max v1) max v2) ...``
    (``Value.max``: a tie keeps the earlier value, which alone gets the gradient)."""
    m = values[0]
    for v in values[1:]:
        m = m.max(v)
    return m


def log_softmax(logits):
    """``z_k - log(sum_j exp(z_j))``, computed as ``z_k - m - log(sum exp(z_j - m))``.

    ``m`` is the largest logit, a node of the graph (not a constant taken at
    trace time), so that ``exp`` never overflows whatever the logits become.
    Its gradient through the two paths cancels: d/dm = -1 + sum(softmax) = 0.
    """
    logits = list(logits)
    m = max_of(logits)
    shifted = [z - m for z in logits]
    log_sum = sum(s.exp() for s in shifted).log()
    return [s - log_sum for s in shifted]


def softmax(logits):
    logits = list(logits)
    m = max_of(logits)
    e = [(z - m).exp() for z in logits]
    total = sum(e)
    return [ei / total for ei in e]


def cross_entropy(logits, target):
    """``-sum_k t_k * log_softmax(z)_k``.

    ``target`` is a class index, or a sequence of Values or numbers (a one-hot
    or probability vector: Values let the compiler feed labels as inputs).
    """
    logp = log_softmax(logits)
    if isinstance(target, int):
        if not 0 <= target < len(logp):
            raise ValueError(f"target class {target} out of range for {len(logp)} logits")
        return -logp[target]
    target = list(target)
    if len(target) != len(logp):
        raise ValueError(f"target has {len(target)} entries for {len(logp)} logits")
    return -sum(t * lp for t, lp in zip(target, logp))


def mse(predictions, targets):
    """Mean of ``(p - t) * (p - t)``."""
    predictions, targets = list(predictions), list(targets)
    if len(predictions) != len(targets) or not predictions:
        raise ValueError(f"mse needs equal, non-empty lengths, got {len(predictions)} and {len(targets)}")
    total = sum((p - t) * (p - t) for p, t in zip(predictions, targets))
    return total / len(predictions)
