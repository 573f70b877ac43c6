"""Karpathy's microgpt in plain numpy, backward derived by hand: the bar a
numpy user sets for ``benchmarks/bench_microgpt.py``.

The model of ``microgpt.py`` (token and position embeddings, rmsnorm, causal
multi-head attention, a ReLU MLP, no biases, the mean cross-entropy over a
name's positions), written the way a numpy user writes it: one name is a
``[T, C]`` float64 matrix (``T`` its positions, as ``forward(n)`` runs ``n``),
every weight is applied once to all positions, the heads are one batched
matrix product, and the backward pass is derived by hand (the derivations
are in the comments). Adam is ``microgpt_train.py``'s (``compiler.Adam``'s
formulas in its order of operations, the rate decaying linearly to 0), so
given the same gradients its step gives ``reference_step``'s bits.

The sums run in other orders than the interpreter's, so the loss and the
gradients agree with it to about 1e-12 relative or better, not bit for bit
(``tests/test_microgpt_numpy.py``). The parameters live in one flat vector
in ``microgpt.matrix_shapes`` order (the order of ours) with each matrix a
view into it, so Adam is a few whole-vector operations, and a layer's
``attn_wq``, ``attn_wk`` and ``attn_wv``, adjacent in that order, are one
``[3C, C]`` view: q, k and v come from one matrix product.

``NumpyGPT`` has the interface ``microgpt_train.train`` drives
(``train_step(tokens, lr)``, ``next_logits``, ``params``, ``optimizer_state``).
How many threads numpy's BLAS uses is set before numpy is imported; the
benchmark sets one.
"""
import math

import numpy as np

from microgpt import RMS_EPS, matrix_shapes, positions_of
from microgpt_train import ADAM_EPS, BETAS

ADAM_BLOCK = 32768          # parameters per block of Adam's passes: 6 x 256 KB, within L2


def rmsnorm(x):
    """Each row times ``s = (mean(x^2) + eps)^-1/2``; returns ``(y, s)``, ``s`` a column."""
    s = 1.0 / np.sqrt((x * x).sum(axis=1, keepdims=True) / x.shape[1] + RMS_EPS)
    return x * s, s


def rmsnorm_backward(x, s, dy):
    """``y_i = x_i s`` with ``s = (sum_j x_j^2 / C + eps)^-1/2``, so
    ``ds/dx_j = -1/2 s^3 2 x_j / C = -s^3 x_j / C`` and
    ``dx_j = s dy_j - x_j s^3 / C * sum_i dy_i x_i``."""
    return s * dy - x * (s * s * s * (dy * x).sum(axis=1, keepdims=True) / x.shape[1])   # s * s * s: s ** 3 costs 5x


class NumpyGPT:
    """microgpt on numpy arrays, trained by ``train_step`` one name at a time.

    ``weights`` is ``{name: rows}`` as ``microgpt.init_weights`` draws them;
    ``lr``, the starting rate, is taken as ``microgpt_train``'s models take
    it, but each step's rate comes with ``train_step``.
    """

    def __init__(self, config, weights, lr):
        self.config, self.lr = config, lr
        shapes = matrix_shapes(config)
        self.flat = np.array([x for name, _, _ in shapes for row in weights[name] for x in row], dtype=np.float64)
        self.grad = np.zeros_like(self.flat)
        self.m, self.v, self.t = np.zeros_like(self.flat), np.zeros_like(self.flat), 0.0
        n = len(self.flat)
        self._adam_blocks = [slice(i, min(i + ADAM_BLOCK, n)) for i in range(0, n, ADAM_BLOCK)]
        self._scratch = np.empty(min(ADAM_BLOCK, n)), np.empty(min(ADAM_BLOCK, n))
        self.w, self.g, offset = {}, {}, 0         # name -> [rows, cols] views of flat / grad
        for name, rows, cols in shapes:
            if name.endswith('.attn_wq'):         # wq, wk, wv are adjacent: also one [3C, C] matrix
                self._view(name[:-len('wq')] + 'qkv', offset, 3 * rows, cols)
            self._view(name, offset, rows, cols)
            offset += rows * cols
        # 0 on and below the diagonal, -inf above: position t attends to 0..t
        self.causal = np.triu(np.full((config.block_size, config.block_size), -np.inf), 1)
        self.scale = 1.0 / math.sqrt(config.head_dim)

    def _view(self, name, offset, rows, cols):
        self.w[name] = self.flat[offset:offset + rows * cols].reshape(rows, cols)
        self.g[name] = self.grad[offset:offset + rows * cols].reshape(rows, cols)

    # ---- forward --------------------------------------------------------------------

    def forward(self, idx):
        """The logits ``[T, vocab]`` of the tokens ``idx`` and what backward needs."""
        c, w = self.config, self.w
        T, H, C = len(idx), c.n_head, c.n_embd
        x0 = w['wte'][idx] + w['wpe'][:T]
        x, s0 = rmsnorm(x0)
        cache = []
        for i in range(c.n_layer):
            layer = f'layer{i}.'
            x_attn_in = x
            h, s1 = rmsnorm(x)
            qkv = (h @ w[layer + 'attn_qkv'].T).reshape(T, 3, H, C // H).transpose(1, 2, 0, 3)
            q, k, v = qkv                                           # each [H, T, hd]
            att = q @ k.transpose(0, 2, 1) * self.scale + self.causal[:T, :T]
            att = np.exp(att - att.max(axis=2, keepdims=True))    # shifted softmax over the keys
            att /= att.sum(axis=2, keepdims=True)
            y = (att @ v).transpose(1, 0, 2).reshape(T, C)
            x = y @ w[layer + 'attn_wo'].T + x_attn_in
            x_mlp_in = x
            h2, s2 = rmsnorm(x)
            a = h2 @ w[layer + 'mlp_fc1'].T
            r = np.maximum(a, 0.0)
            x = r @ w[layer + 'mlp_fc2'].T + x_mlp_in
            cache.append((x_attn_in, h, s1, q, k, v, att, y, x_mlp_in, h2, s2, a, r))
        logits = x @ w['lm_head'].T
        return logits, (x0, s0, cache, x)

    def loss_and_grad(self, tokens):
        """The mean cross-entropy over the name's positions; fills ``self.grad``."""
        c, w, g = self.config, self.w, self.g
        n = positions_of(tokens, c)
        idx, targets = np.array(tokens[:n]), np.array(tokens[1:n + 1])
        T, H, C, rows = n, c.n_head, c.n_embd, np.arange(n)
        logits, (x0, s0, cache, x) = self.forward(idx)
        z = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(z)
        total = e.sum(axis=1)
        loss = float(np.mean(np.log(total) - z[rows, targets]))

        # ---- backward -------------------------------------------------------------
        # d(mean_t (log sum_j exp z_tj - z_t,target)) / dz_tk = (softmax_tk - [k = target]) / T
        dlogits = e / total[:, None]
        dlogits[rows, targets] -= 1.0
        dlogits /= T
        np.matmul(dlogits.T, x, out=g['lm_head'])
        dx = dlogits @ w['lm_head']
        for i in reversed(range(c.n_layer)):
            layer = f'layer{i}.'
            x_attn_in, h, s1, q, k, v, att, y, x_mlp_in, h2, s2, a, r = cache[i]
            # x = fc2(relu(fc1(rmsnorm(x_mlp_in)))) + x_mlp_in
            np.matmul(dx.T, r, out=g[layer + 'mlp_fc2'])
            da = dx @ w[layer + 'mlp_fc2']
            da *= a > 0                     # relu'(0) = 0, as micrograd takes it
            np.matmul(da.T, h2, out=g[layer + 'mlp_fc1'])
            dx = dx + rmsnorm_backward(x_mlp_in, s2, da @ w[layer + 'mlp_fc1'])
            # x = wo(attention(q, k, v)) + x_attn_in
            np.matmul(dx.T, y, out=g[layer + 'attn_wo'])
            dy = (dx @ w[layer + 'attn_wo']).reshape(T, H, C // H).transpose(1, 0, 2)   # [H, T, hd]
            # y = P v:  dP = dy v^T,  dv = P^T dy
            datt = dy @ v.transpose(0, 2, 1)
            dv = att.transpose(0, 2, 1) @ dy
            # P = softmax(S) by rows: dS_ts = P_ts (dP_ts - sum_u dP_tu P_tu); masked P = 0 gives dS = 0
            datt -= (datt * att).sum(axis=2, keepdims=True)
            datt *= att
            datt *= self.scale              # S = q k^T * scale
            dq = datt @ k
            dk = datt.transpose(0, 2, 1) @ q
            dqkv = np.stack((dq, dk, dv)).transpose(2, 0, 1, 3).reshape(T, 3 * C)
            np.matmul(dqkv.T, h, out=g[layer + 'attn_qkv'])
            dx = dx + rmsnorm_backward(x_attn_in, s1, dqkv @ w[layer + 'attn_qkv'])
        dx0 = rmsnorm_backward(x0, s0, dx)
        # x0 = wte[idx] + wpe[:T]: a token seen twice gets both rows' gradients
        g['wte'][:] = 0.0
        np.add.at(g['wte'], idx, dx0)
        g['wpe'][T:] = 0.0
        g['wpe'][:T] = dx0
        return loss

    # ---- Adam -----------------------------------------------------------------------

    def adam_step(self, lr):
        """``compiler.Adam.reference_step`` on whole vectors, each operation in its
        order (``x * y`` is ``y * x`` in IEEE arithmetic, so in-place forms keep the bits):
        ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g g``;
        ``p = p - lr (m / c1) / (sqrt(v / c2) + eps)`` with ``c = 1 - b^t``.

        In blocks of ``ADAM_BLOCK`` parameters: with 200k parameters p, g, m
        and v are 6.4 MB, and whole-vector passes would stream them from
        memory 14 times; a block's passes stay in cache
        (1.3 ms -> 1.0 ms a step at n_embd 64, 4 layers). In-place operations
        into preallocated scratch: the textbook one-liners allocate a
        temporary per operation (3.5 ms there)."""
        b1, b2 = BETAS
        self.t += 1.0
        c1, c2 = 1.0 - math.pow(b1, self.t), 1.0 - math.pow(b2, self.t)
        for block in self._adam_blocks:
            p, g, m, v = self.flat[block], self.grad[block], self.m[block], self.v[block]
            step, den = (a[:block.stop - block.start] for a in self._scratch)
            m *= b1
            np.multiply(g, 1.0 - b1, out=step)
            m += step
            v *= b2
            np.multiply(g, 1.0 - b2, out=step)
            step *= g
            v += step
            np.divide(m, c1, out=step)
            step *= lr
            np.divide(v, c2, out=den)
            np.sqrt(den, out=den)
            den += ADAM_EPS
            step /= den
            p -= step

    # ---- what microgpt_train.train and sample call --------------------------------

    def train_step(self, tokens, lr):
        """One Adam step on the name ``tokens``; returns the loss before it."""
        loss = self.loss_and_grad(tokens)
        self.adam_step(lr)
        return loss

    def next_logits(self, tokens):
        logits, _ = self.forward(np.array(tokens))
        return logits[-1].tolist()

    def params(self):
        return self.flat.tolist()

    def optimizer_state(self):
        return [self.t, *self.m.tolist(), *self.v.tolist()]
