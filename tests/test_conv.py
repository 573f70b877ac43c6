"""The interpreter's image building blocks: Conv2d, MaxPool2d, AvgPool2d,
ReLU, Flatten, Sequential. Their forward values are checked bit for bit
against plain floats added in the documented order, their gradients against
finite differences and PyTorch, and small conv nets compiled against the
interpreter."""
import json
import math
import os
import random
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given, settings, strategies as st

from micrograd import Value, cross_entropy
from micrograd.nn import AvgPool2d, Conv2d, Flatten, Layer, MaxPool2d, ReLU, Sequential
from tests.differential import (COMPILERS, FAST_CC, assert_matches_interpreter, assert_train_batch_matches_interpreter,
                                needs_cc, same)


def image(channels, rows, cols, rng, scale=1.0):
    return [[[rng.uniform(-scale, scale) for _ in range(cols)] for _ in range(rows)]
            for _ in range(channels)]


def values(img):
    return [[[Value(x) for x in row] for row in plane] for plane in img]


def data(out):
    return [[[v.data for v in row] for row in plane] for plane in out]


def conv_reference(conv, img):
    """The documented sum, in plain floats: the bias, then w * x over (c, i, j)
    in order, padding positions left out."""
    k, s, pad = conv.kernel_size, conv.stride, conv.padding
    C, H, W = len(img), len(img[0]), len(img[0][0])
    out = []
    for w, b in zip(conv.w, conv.b):
        plane = []
        for y in range(conv.output_size(H)):
            row = []
            for x in range(conv.output_size(W)):
                acc = b.data
                for c in range(C):
                    for i in range(k):
                        for j in range(k):
                            r, q = y * s + i - pad, x * s + j - pad
                            if 0 <= r < H and 0 <= q < W:
                                acc = acc + w[(c * k + i) * k + j].data * img[c][r][q]
                row.append(acc)
            plane.append(row)
        out.append(plane)
    return out


shapes = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 5), st.integers(1, 2),
                   st.integers(0, 2), st.integers(5, 9), st.integers(5, 9), st.integers(0, 2 ** 32 - 1))


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_conv2d_adds_each_window_in_the_documented_order(shape):
    cin, cout, k, stride, pad, H, W, seed = shape
    rng = random.Random(seed)
    conv = Conv2d(cin, cout, k, stride=stride, padding=pad, rng=rng)
    for b in conv.b:
        b.data = rng.uniform(-1, 1)
    img = image(cin, H, W, rng)
    got = data(conv(values(img)))
    want = conv_reference(conv, img)
    assert len(got[0]) == (H + 2 * pad - k) // stride + 1 and len(got[0][0]) == (W + 2 * pad - k) // stride + 1
    assert all(same(a, b) for pa, pb in zip(got, want) for ra, rb in zip(pa, pb) for a, b in zip(ra, rb))


def test_conv2d_gradients_match_finite_differences():
    rng = random.Random(3)
    conv = Conv2d(2, 2, 3, stride=2, padding=1, rng=rng)
    img = image(2, 5, 5, rng)

    def loss_of(img_values):
        out = conv(img_values)
        return sum((v * v for plane in out for row in plane for v in row), Value(0.0))
    x = values(img)
    loss = loss_of(x)
    loss.backward()
    h = 1e-6
    for p in conv.parameters()[:10] + conv.parameters()[-3:]:
        old = p.data
        p.data = old + h
        up = loss_of(values(img)).data
        p.data = old - h
        down = loss_of(values(img)).data
        p.data = old
        assert math.isclose(p.grad, (up - down) / (2 * h), rel_tol=1e-5, abs_tol=1e-7)
    for c, i, j in ((0, 0, 0), (1, 2, 3), (1, 4, 4)):
        img[c][i][j] += h
        up = loss_of(values(img)).data
        img[c][i][j] -= 2 * h
        down = loss_of(values(img)).data
        img[c][i][j] += h
        assert math.isclose(x[c][i][j].grad, (up - down) / (2 * h), rel_tol=1e-5, abs_tol=1e-7)


def test_pools_relu_and_flatten():
    img = values([[[1.0, 5.0, 2.0], [5.0, 0.0, -1.0], [3.0, 4.0, 9.0]],
                  [[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0], [0.0, 0.0, 0.0]]])
    pooled = MaxPool2d(2, stride=1)(img)
    assert data(pooled) == [[[5.0, 5.0], [5.0, 9.0]], [[-1.0, -2.0], [0.0, 0.0]]]
    pooled[0][0][0].backward()          # a tie between the 5.0s: the first one gets the gradient
    assert [v.grad for v in (img[0][0][1], img[0][1][0])] == [1.0, 0.0]
    avg = AvgPool2d(2)(values([[[1.0, 2.0, 7.0], [3.0, 4.0, 7.0], [7.0, 7.0, 7.0]]]))
    assert data(avg) == [[[((1.0 + 2.0) + 3.0 + 4.0) * 0.25]]]      # floor mode: one window
    assert data(ReLU()(img))[1] == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert [v.data for v in Flatten()(img)][:4] == [1.0, 5.0, 2.0, 5.0]


def test_parameters_are_out_channel_by_out_channel_weights_then_bias():
    conv = Conv2d(2, 3, 2, seed=0)
    params = conv.parameters()
    assert len(params) == 3 * (2 * 2 * 2 + 1)
    for o in range(3):
        row = params[o * 9:(o + 1) * 9]
        assert row[:8] == conv.w[o] and row[8] is conv.b[o]


@pytest.mark.parametrize('bad, message', [
    (dict(in_channels=0, out_channels=1, kernel_size=1), 'in_channels'),
    (dict(in_channels=1, out_channels=1, kernel_size=True), 'kernel_size'),
    (dict(in_channels=1, out_channels=1, kernel_size=3, stride=0), 'stride'),
    (dict(in_channels=1, out_channels=1, kernel_size=3, padding=-1), 'padding'),
    (dict(in_channels=1, out_channels=1, kernel_size=3, init='xavier'), 'init'),
])
def test_bad_settings_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        Conv2d(**bad)


def test_bad_images_are_refused():
    conv = Conv2d(2, 1, 3)
    with pytest.raises(ValueError, match='images of 2 channels, got 1'):
        conv(values(image(1, 5, 5, random.Random(0))))
    with pytest.raises(ValueError, match='smaller'):
        conv(values(image(2, 2, 5, random.Random(0))))
    with pytest.raises(ValueError, match='not rectangular'):
        conv([[[Value(1.0)] * 3] * 3, [[Value(1.0)] * 2] * 3])
    with pytest.raises(TypeError, match='image'):
        conv([Value(1.0)])
    with pytest.raises(ValueError, match='smaller'):
        MaxPool2d(4)(values(image(1, 3, 3, random.Random(0))))


@pytest.mark.torch
def test_against_pytorch_conv2d_and_pools():
    torch = pytest.importorskip('torch')
    rng = random.Random(7)
    conv = Conv2d(2, 3, 3, stride=2, padding=1, rng=rng)
    for b in conv.b:
        b.data = rng.uniform(-1, 1)
    img = image(2, 7, 7, rng)
    x = values(img)
    out = AvgPool2d(2)(MaxPool2d(2, stride=1)(ReLU()(conv(x))))
    loss = sum((v * v for v in Flatten()(out)), Value(0.0))
    loss.backward()

    p = torch.tensor([q.data for q in conv.parameters()], dtype=torch.float64).reshape(3, -1)
    weight = p[:, :-1].reshape(3, 2, 3, 3).clone().requires_grad_()
    bias = p[:, -1].clone().requires_grad_()
    timg = torch.tensor(img, dtype=torch.float64, requires_grad=True)
    t = torch.nn.functional.conv2d(timg[None], weight, bias, stride=2, padding=1).relu()
    t = torch.nn.functional.avg_pool2d(torch.nn.functional.max_pool2d(t, 2, stride=1), 2)
    tloss = (t * t).sum()
    tloss.backward()
    assert math.isclose(loss.data, tloss.item(), rel_tol=1e-12)
    grads = torch.cat([weight.grad.reshape(3, -1), bias.grad[:, None]], 1).reshape(-1).tolist()
    for g, q in zip(grads, conv.parameters()):
        assert math.isclose(q.grad, g, rel_tol=1e-9, abs_tol=1e-12)
    for c in range(2):
        for i in range(7):
            for j in range(7):
                assert math.isclose(x[c][i][j].grad, timg.grad[c][i][j].item(), rel_tol=1e-9, abs_tol=1e-12)


def small_conv_net(params):
    """conv 3x3 (2 channels, padding 1) -> relu -> maxpool 2 -> conv 3x3 (3) ->
    relu -> avgpool 2 -> flatten -> 4 logits, on 9x9 images, with ``params``
    (Values, or None for fresh ones) as its parameters, in parameters() order."""
    rng = random.Random(0)
    net = Sequential(Conv2d(1, 2, 3, padding=1, rng=rng), ReLU(), MaxPool2d(2),
                     Conv2d(2, 3, 3, rng=rng), ReLU(), AvgPool2d(2), Flatten(),
                     Layer(3, 4, nonlin=False, rng=rng))
    if params is not None:
        it = iter(params)
        for m in net.modules:
            if isinstance(m, Conv2d):
                m.w = [[next(it) for _ in w] for w in m.w]
                m.b = [next(it) for _ in m.b]
            elif isinstance(m, Layer):
                for n in m.neurons:
                    n.w = [next(it) for _ in n.w]
                    n.b = next(it)
        assert next(it, None) is None
    return net


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_a_small_conv_net_compiles_to_the_interpreters_bits(cc):
    side = 9
    param_values = [p.data + 0.01 * i for i, p in enumerate(small_conv_net(None).parameters())]

    def build(inputs, params):
        logits = small_conv_net(params)([[inputs[r * side:(r + 1) * side] for r in range(side)]])
        return cross_entropy(logits, inputs[side * side:]), logits
    rng = random.Random(0)
    samples = [[rng.choice((0.0, rng.uniform(0, 1))) for _ in range(side * side)]
               + [1.0 if i == k else 0.0 for i in range(4)] for k in range(3)]
    assert_matches_interpreter(build, samples, param_values, cc)


# -- the convolution pass (compiler/conv.py): random small conv nets against the interpreter --

def random_net_spec(seed):
    """A random small conv net that fits its image: conv (kernel 1-5, stride
    1-2, padding 0-2, 1-4 channels) -> relu -> pooling (max, avg or none) ->
    conv -> relu -> flatten -> 3 logits, on an odd-sized image."""
    rng = random.Random(seed)
    while True:
        spec = dict(cin=rng.randint(1, 3), c1=rng.randint(1, 4), k1=rng.randint(1, 5), s1=rng.randint(1, 2),
                    p1=rng.randint(0, 2), pool=rng.choice([None, ('max', 2, 2), ('avg', 2, 2), ('max', 3, 1)]),
                    c2=rng.randint(1, 4), k2=rng.randint(1, 4), s2=rng.randint(1, 2), p2=rng.randint(0, 2),
                    h=rng.choice([5, 7, 9, 11]), w=rng.choice([5, 7, 9]))
        if spec['p1'] >= spec['k1'] or spec['p2'] >= spec['k2']:
            continue       # PyTorch's rule: padding below the kernel
        try:
            net = conv_net(spec, None)
            net([[[Value(0.0)] * spec['w'] for _ in range(spec['h'])] for _ in range(spec['cin'])])
        except ValueError:
            continue       # the image is too small for this stack
        return spec


def conv_net(spec, params):
    rng = random.Random(1)
    modules = [Conv2d(spec['cin'], spec['c1'], spec['k1'], stride=spec['s1'], padding=spec['p1'], rng=rng), ReLU()]
    if spec['pool']:
        kind, k, s = spec['pool']
        modules.append((MaxPool2d if kind == 'max' else AvgPool2d)(k, stride=s))
    modules += [Conv2d(spec['c1'], spec['c2'], spec['k2'], stride=spec['s2'], padding=spec['p2'], rng=rng), ReLU(),
                Flatten()]
    net = Sequential(*modules)
    if params is not None:
        it = iter(params)
        _adopt_convs(net, it)
        head = list(it)
        return lambda image: _logits(net(image), head)
    return net


def _adopt_convs(net, it):
    """The convs of ``net`` take their weights and biases from ``it``, in parameters() order."""
    for m in net.modules:
        if isinstance(m, Conv2d):
            m.w = [[next(it) for _ in w] for w in m.w]
            m.b = [next(it) for _ in m.b]


def _logits(features, head):
    """3 linear logits over the features, from the parameters left after the convs."""
    n = len(features)
    return [sum((head[o * (n + 1) + i] * f for i, f in enumerate(features)), head[o * (n + 1) + n])
            for o in range(3)]


def conv_net_case(seed, spec=None):
    """``(spec, build, samples, parameter values)`` of ``spec`` (default
    ``random_net_spec(seed)``): inputs are the image (channel, row, column),
    then a one-hot label of 3."""
    spec = spec or random_net_spec(seed)
    rng = random.Random(seed)
    cin, h, w = spec['cin'], spec['h'], spec['w']
    conv_params = conv_net(spec, None).parameters()
    probe = conv_net(spec, None)([[[Value(0.0)] * w for _ in range(h)] for _ in range(cin)])
    n_features = len(probe)
    n_params = len(conv_params) + 3 * (n_features + 1)
    param_values = [rng.uniform(-1, 1) for _ in range(n_params)]
    n_pixels = cin * h * w

    def build(inputs, params):
        image = [[inputs[(c * h + r) * w:(c * h + r + 1) * w] for r in range(h)] for c in range(cin)]
        logits = conv_net(spec, params)(image)
        return cross_entropy(logits, inputs[n_pixels:]), logits
    samples = [[rng.choice((0.0, rng.uniform(-1, 1))) for _ in range(n_pixels)]
               + [1.0 if i == k else 0.0 for i in range(3)] for k in range(2)]
    return spec, build, samples, param_values


def lifted_convs(model):
    from compiler.ir import Conv
    return [op for op in model.program.ops if type(op) is Conv]


# a sample of the grid (kernel, stride, padding, channels, pooling, image size),
# each case with one of the compilers in turn: seeds chosen to cover each value
CASES = list(range(12))


@needs_cc
@pytest.mark.parametrize('seed', CASES)
def test_random_conv_nets_are_bit_identical_with_the_pass(seed):
    spec, build, samples, param_values = conv_net_case(seed)
    cc = COMPILERS[seed % len(COMPILERS)]
    model = assert_matches_interpreter(build, samples, param_values, cc, input_grads=seed % 3 == 0)
    # every conv applied at two positions or more is lifted, padding or not
    # (seeds 0, 1 and 7: positions vectorize took as layers, see below)
    lifted, expected = len(lifted_convs(model)) + matrices_at_positions(model), sum(
        positions >= 2 for positions in conv_positions(spec))
    assert lifted == expected, spec


def matrices_at_positions(model):
    """Convs whose every position vectorize lifted: one ``MatVec`` per
    position (a 1x1 kernel), sharing one block of weights."""
    from collections import Counter
    from compiler.ir import MatVec
    uses = Counter(op.wt0 for op in model.program.ops if type(op) is MatVec)
    return sum(n >= 2 for n in uses.values())


# a 3x3 kernel with padding 1 on a 3x3 image: its centre reads the whole image
# (consecutive inputs), a layer to vectorize when the image needs no gradient; a
# 1x1 kernel: every position one pixel of each channel, one matrix at 9 positions
WHOLE_IMAGE_AND_1X1 = dict(cin=2, c1=3, k1=3, s1=1, p1=1, pool=None, c2=2, k2=1, s2=1, p2=0, h=3, w=3)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('input_grads', [False, True])
def test_positions_vectorize_lifts_as_layers_join_their_conv(cc, input_grads):
    """A position whose window is consecutive inputs is a ``MatVec`` after
    vectorize (only when the image needs no gradient: other positions read
    its pixels); the conv pass takes its rows into the conv. A kernel whose
    every position vectorize lifted stays as those ``MatVec`` ops."""
    spec, build, samples, param_values = conv_net_case(5, WHOLE_IMAGE_AND_1X1)
    model = assert_matches_interpreter(build, samples, param_values, cc, input_grads=input_grads)
    assert [op.x.shape for op in lifted_convs(model)] == [(9, 18)]       # 9 positions, 2 x 3 x 3 offsets
    assert matrices_at_positions(model) == 1


def conv_positions(spec):
    """The output positions of each conv of ``random_net_spec``."""
    def out(size, k, s, p):
        return (size + 2 * p - k) // s + 1
    h1, w1 = out(spec['h'], spec['k1'], spec['s1'], spec['p1']), out(spec['w'], spec['k1'], spec['s1'], spec['p1'])
    h, w = h1, w1
    if spec['pool']:
        _, k, s = spec['pool']
        h, w = out(h, k, s, 0), out(w, k, s, 0)
    return h1 * w1, out(h, spec['k2'], spec['s2'], spec['p2']) * out(w, spec['k2'], spec['s2'], spec['p2'])


@needs_cc
@pytest.mark.parametrize('seed', CASES[:4])
def test_random_conv_nets_are_bit_identical_without_the_pass(seed, monkeypatch):
    import compiler
    monkeypatch.setattr(compiler.passes, 'lift_convs', lambda program: program)
    spec, build, samples, param_values = conv_net_case(seed)
    model = assert_matches_interpreter(build, samples, param_values, FAST_CC)    # straight-line: tcc builds it quickest
    assert not lifted_convs(model)


@needs_cc
@pytest.mark.parametrize('threads', [1, 2, 3])
def test_random_conv_nets_train_to_the_same_bits_at_any_thread_count(threads):
    import numpy as np
    for seed in (20 + threads, 30 + threads):
        spec, build, samples, param_values = conv_net_case(seed)
        X = np.array(samples * 12)     # 24 rows: every thread count runs 8 images in the lanes of one vector
        assert_train_batch_matches_interpreter(build, X, param_values, 0.1, COMPILERS[(seed + threads) % len(COMPILERS)],
                                               steps=2, threads=threads)


# Channels in several vectors of 8 (the weight gradient's tiles take at most
# 4, 2 or 1 of them on AVX-512, AVX2 and the baseline: compiler/codegen/conv.py),
# a padded first conv (windows cut by the padding between runs of whole ones)
WIDE = dict(cin=2, c1=17, k1=3, s1=1, p1=1, pool=None, c2=33, k2=2, s2=1, p2=0, h=5, w=5)

WIDE_RUN = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [{root!r}]
    import numpy as np
    from tests.differential import assert_matches_interpreter, assert_train_batch_matches_interpreter
    from tests.test_conv import WIDE, conv_net_case, lifted_convs, varied
    spec, build, samples, param_values = conv_net_case(5, dict(WIDE))
    model = assert_matches_interpreter(build, samples, param_values, {cc!r})
    assert len(lifted_convs(model)) == 2
    # {threads} threads on 40 rows: the input gradient's 32 and 8 images at once, and one by one
    assert_train_batch_matches_interpreter(build, varied(samples, 40), param_values, 0.1, {cc!r}, threads={threads})
    print(json.dumps({{'isa': model.module.kernels}}))
""")


@needs_cc
@pytest.mark.parametrize('want', ['base', 'avx2', 'avx512'])
def test_wide_conv_nets_are_exact_on_every_instruction_set(want):
    cc = next((cc for cc in COMPILERS if cc != 'tcc'), None)
    if cc is None:
        pytest.skip('needs gcc or clang: tcc builds only the plain loops')
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, MICROGRAD_KERNELS=want)
    threads = {'base': 3, 'avx2': 2, 'avx512': 1}[want]
    done = subprocess.run([sys.executable, '-c', WIDE_RUN.format(root=root, cc=cc, threads=threads)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    if want == 'base':
        assert json.loads(done.stdout.splitlines()[-1])['isa'] == 'base'


@pytest.mark.skipif('tcc' not in COMPILERS, reason='tcc builds the plain loops')
def test_wide_conv_nets_are_exact_in_plain_c():
    spec, build, samples, param_values = conv_net_case(5, dict(WIDE))
    model = assert_matches_interpreter(build, samples, param_values, 'tcc')
    assert len(lifted_convs(model)) == 2


def varied(samples, n):
    """``n`` rows: the samples in turn, each row's inputs but the label's 3
    scaled by its own factor (no two groups of 8 rows alike)."""
    import numpy as np
    X = np.array([samples[r % len(samples)] for r in range(n)])
    X[:, :-3] *= 1.0 + np.arange(n)[:, None] / 16
    return X


def bgx_paths(model):
    """Whether each conv's input gradient runs pulled (its rows channel by
    channel, templates/conv_body.c) or pushed, by name."""
    import re
    pulled = dict(re.findall(r'static const ConvOp (conv\d+) = \{.*, (\d), conv\d+_oorder', model.source))
    return {name: pulled[name] == '1' for name in re.findall(r'->bgx\(&(conv\d+)', model.source)}


@needs_cc
def test_the_input_gradient_pulled_in_blocks_of_images_and_pushed():
    import numpy as np
    # 43 rows on one thread: 32 images in the lanes at once (inputs in blocks
    # and one by one), then 8, then 3 one by one
    spec, build, samples, param_values = conv_net_case(1)
    model = assert_train_batch_matches_interpreter(build, varied(samples, 43), param_values, 0.1,
                                                   COMPILERS[-1], threads=1)
    assert bgx_paths(model) == {'conv2': True}
    # a conv whose outputs (through an average pool) the next conv reads window by
    # window, every channel at each place: its rows go in that order, not
    # channel by channel, so its input gradient is pushed
    side = 11
    rng = random.Random(3)
    shape = Sequential(Conv2d(1, 2, 3, rng=rng), ReLU(), Conv2d(2, 3, 2, rng=rng), AvgPool2d(2),
                       Conv2d(3, 2, 2, rng=rng), ReLU(), Flatten())
    n_features = len(shape([[[Value(0.0)] * side for _ in range(side)]]))
    param_values = [rng.uniform(-1, 1) for _ in range(len(shape.parameters()) + 3 * (n_features + 1))]

    def build(inputs, params):
        it = iter(params)
        _adopt_convs(shape, it)
        logits = _logits(shape([[inputs[r * side:(r + 1) * side] for r in range(side)]]), list(it))
        return cross_entropy(logits, inputs[side * side:]), logits
    X = np.array([[rng.choice((0.0, rng.uniform(-1, 1))) for _ in range(side * side)]
                  + [1.0 if i == r % 3 else 0.0 for i in range(3)] for r in range(20)])
    for threads in (1, 2):
        model = assert_train_batch_matches_interpreter(build, X, param_values, 0.1, COMPILERS[-1], threads=threads)
    assert bgx_paths(model) == {'conv2': False, 'conv3': True}


def test_random_specs_cover_the_grid():
    specs = [random_net_spec(s) for s in CASES + [21, 22, 23, 31, 32, 33]]
    assert {s['k1'] for s in specs} | {s['k2'] for s in specs} >= {1, 2, 3, 4, 5}
    assert {s['s1'] for s in specs} | {s['s2'] for s in specs} == {1, 2}
    assert {s['p1'] for s in specs} | {s['p2'] for s in specs} == {0, 1, 2}
    assert {s['c1'] for s in specs} | {s['c2'] for s in specs} >= {1, 2, 3, 4}
    assert {s['pool'] for s in specs} >= {None, ('max', 2, 2), ('avg', 2, 2)}


@needs_cc
def test_a_conv_weight_with_another_use_is_left_to_scalar_code():
    """A weight that a regulariser also reads: its gradient is not the
    channel's alone, so that channel stays as it was; still exact."""
    spec, build, samples, param_values = conv_net_case(3)

    def regularised(inputs, params):
        loss, logits = build(inputs, params)
        return loss + params[0] * params[0], logits
    model = assert_matches_interpreter(regularised, samples, param_values, COMPILERS[0])
    for op in lifted_convs(model):
        assert model.program.param_slots[0] not in op.weights


# -- ReLUs and max-pools as loops (compiler/loops.py): ties, -0.0, NaN, edges --------

SPECIAL = (0.0, -0.0, 1.0, -1.0, 0.5, float('nan'), float('inf'))


def pooling_net(params):
    """relu -> max-pool 3, stride 2 (a 7x7 image: the last windows touch its
    edge) -> conv 2x2 (2 channels) -> relu -> max-pool 2, stride 1 ->
    flatten -> 3 logits: the pools read the image's own values (ties, -0.0,
    NaN) and the conv's. Returns the first pool's values, the features and
    the logits (a sign of zero shows in the first two)."""
    rng = random.Random(2)
    first = Sequential(ReLU(), MaxPool2d(3, stride=2))
    rest = Sequential(Conv2d(1, 2, 2, rng=rng), ReLU(), MaxPool2d(2, stride=1), Flatten())
    it = iter(params)
    conv = rest.modules[0]
    conv.w = [[next(it) for _ in w] for w in conv.w]
    conv.b = [next(it) for _ in conv.b]
    head = list(it)

    def run(image):
        pooled = first(image)
        features = rest(pooled)
        return Flatten()(pooled), features, _logits(features, head)
    return run


def pooling_case(values, seed):
    """Samples of a 7x7 image drawn from ``values`` (ties everywhere), and
    parameters: the conv's weights in {-1, 0, 1} and biases 0 or -0.0 (ties
    and signed zeros after it too)."""
    rng = random.Random(seed)
    side, n_features = 7, 2 * 2 * 2
    n_params = 2 * 4 + 2 + 3 * (n_features + 1)
    param_values = ([rng.choice((-1.0, 0.0, 1.0)) for _ in range(8)] + [0.0, -0.0]
                    + [rng.uniform(-1, 1) for _ in range(n_params - 10)])

    def build(inputs, params):
        image = [[inputs[r * side:(r + 1) * side] for r in range(side)]]
        pooled, features, logits = pooling_net(params)(image)
        return cross_entropy(logits, inputs[side * side:]), pooled + features + logits
    samples = [[rng.choice(values) for _ in range(side * side)] + [1.0 if i == k else 0.0 for i in range(3)]
               for k in range(3)]
    return build, samples, param_values


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('values', [(0.0, 1.0), (0.0, -0.0, -1.0), SPECIAL], ids=['ties', 'zeros', 'special'])
@pytest.mark.parametrize('loops', [True, False], ids=['loops', 'scalar'])
def test_relus_and_max_pools_keep_ties_signed_zeros_and_nans(cc, values, loops, monkeypatch):
    """A tie in a window gives the earlier value the gradient, relu(-0.0) is
    -0.0, a NaN loses every comparison: the same bits and the same input
    gradients with the ReLUs and max-pools as loops and as scalar code."""
    import compiler
    from compiler.ir import Loop
    if not loops:
        monkeypatch.setattr(compiler.passes, 'lift_loops', lambda program: program)
    build, samples, param_values = pooling_case(values, seed=len(values))
    model = assert_matches_interpreter(build, samples, param_values, cc, input_grads=True)
    looped = [op for op in model.program.ops if type(op) is Loop]
    names = {b.name for op in looped for b in op.body}
    assert (names >= {'relu', 'max'}) if loops else not looped
