"""The interpreter's image building blocks: Conv2d, MaxPool2d, AvgPool2d,
ReLU, Flatten, Sequential. Their forward values are checked bit for bit
against plain floats added in the documented order, their gradients against
finite differences and PyTorch, and small conv nets compiled against the
interpreter."""
import math
import random

import pytest
from hypothesis import given, settings, strategies as st

from micrograd import Value, cross_entropy
from micrograd.nn import AvgPool2d, Conv2d, Flatten, Layer, MaxPool2d, ReLU, Sequential
from tests.differential import COMPILERS, assert_matches_interpreter, needs_cc, same


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
