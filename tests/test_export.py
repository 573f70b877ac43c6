"""The compiled model as a standalone artifact: export, ``import nn`` in a
bare Python, ``compiler.load``, and ``nn.c`` built by hand with plain flags."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

import compiler
from compiler import cpu
from compiler.constants import KERNELS
from compiler.codegen import emit_header
from compiler.export import ExportError
from micrograd import Value, cross_entropy
from micrograd.nn import MLP

from tests.differential import COMPILERS, FAST_CC, needs_cc, same

pytestmark = needs_cc


def small_mlp():
    """A 6-5-3 MLP: two MatVecs (so the pass permutes its parameters), labelled leaves."""
    model = MLP(6, [5, 3], seed=4, init='scaled')
    xs = [Value(0.0, label=f'x{i}') for i in range(6)]
    ts = [Value(0.0, label=f't{i}') for i in range(3)]
    for i, p in enumerate(model.parameters()):
        p.label = f'p{i}'
    logits = model(xs)
    return cross_entropy(logits, ts), xs + ts, model.parameters(), logits


X = np.random.default_rng(3).standard_normal((40, 9))
X[:, 6:] = np.eye(3)[np.arange(40) % 3]


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    loss, inputs, params, outputs = small_mlp()
    m = compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)
    m.train_batch(X, 0.3)
    folder = tmp_path_factory.mktemp('export') / 'model'
    m.export(folder)
    return m, folder


# a bare Python: no site-packages (so neither micrograd, compiler nor numpy),
# run from another folder, reading rows as text
BARE = '''
import array, json, sys
sys.path.insert(0, sys.argv[1])
import nn
out = {"params": None, "loss": [], "grads": []}
buf = array.array("d", bytes(8 * nn.n_params))
nn.read_params(buf)
out["params"] = [x.hex() for x in buf]
for line in sys.stdin:
    nn.set_input(array.array("d", [float.fromhex(x) for x in line.split()]))
    nn.zero_grad()
    out["loss"].append(nn.forward().hex())
    nn.backward()
    nn.read_grads(buf)
    out["grads"].append([x.hex() for x in buf])
out["modules"] = sorted(m for m in ("micrograd", "compiler", "numpy") if m in sys.modules)
print(json.dumps(out))
'''


def run_bare(folder, rows, tmp_path, python=sys.executable):
    r = subprocess.run([python, '-I', '-S', '-c', BARE, str(folder)], cwd=tmp_path,
                       input='\n'.join(' '.join(x.hex() for x in row) for row in rows),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_an_export_holds_the_four_files_and_nn_json_says_what_it_is(trained):
    m, folder = trained
    assert sorted(os.listdir(folder)) == ['nn.abi3.so', 'nn.c', 'nn.h', 'nn.json']
    source = (folder / 'nn.c').read_text()
    assert (folder / 'nn.h').read_text() == emit_header(source)     # the C API of the nn.c beside it
    info = json.loads((folder / 'nn.json').read_text())
    assert info['header'] == 'nn.h'
    for key in ('format', 'generator', 'program_hash', 'n_inputs', 'n_params', 'n_outputs',
                'input_labels', 'param_labels', 'compiler', 'flags'):
        assert key in info, key
    assert info['format'] == 1 and info['program_hash'] == m.module.program_hash
    assert (info['n_inputs'], info['n_params'], info['n_outputs']) == (9, 6 * 5 + 5 + 5 * 3 + 3, 3)
    assert info['input_labels'][:2] == ['x0', 'x1'] and info['param_labels'][52] == 'p52'


def test_import_nn_in_a_bare_python_gives_the_models_bits(trained, tmp_path):
    m, folder = trained
    got = run_bare(folder, X[:5], tmp_path)
    assert got['modules'] == []
    # the weights at export, in the order of params (the pass permuted them inside)
    assert got['params'] == [x.hex() for x in m.params()]
    for row, loss, grads in zip(X[:5], got['loss'], got['grads']):
        m.set_input(row)
        m.zero_grad()
        assert float.fromhex(loss) == m.forward()
        m.backward()
        assert [float.fromhex(g) for g in grads] == m.grads().tolist()


@pytest.mark.skipif(not [cc for cc in COMPILERS if cc != 'tcc'], reason='needs gcc or clang: tcc builds '
                    'only the plain loops')
@pytest.mark.skipif(cpu.cpu_flags() is None, reason="this CPU's flags cannot be read")
def test_an_exported_module_carries_every_vector_set(tmp_path):
    """A build here carries only the sets this CPU picks (compiler.cpu); an
    export's shared object, like its nn.c, carries them all: it may be
    loaded on another CPU (here: asked for AVX2 on an AVX-512 one)."""
    cc = next(cc for cc in COMPILERS if cc != 'tcc')
    loss, inputs, params, outputs = small_mlp()
    m = compiler.compile(loss, inputs, params, outputs, cc=cc)
    folder = m.export(tmp_path / 'model')
    for want in KERNELS:
        r = subprocess.run([sys.executable, '-I', '-S', '-c', 'import sys; sys.path.insert(0, sys.argv[1]); '
                            'import nn; print(nn.kernels)', str(folder)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, MICROGRAD_KERNELS=want))
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == (cpu.sets_for(cpu.cpu_flags(), want) or ('base',))[0]


def test_compiler_load_round_trip(trained):
    m, folder = trained
    loaded = compiler.load(folder)
    assert loaded.module.program_hash == m.module.program_hash
    assert np.array_equal(loaded.params(), m.params())
    assert loaded.input_labels == m.input_labels and loaded.param_labels == m.param_labels
    assert np.array_equal(loaded.predict(X), m.predict(X))
    assert loaded.features == m.features
    before = m.params()
    assert same(loaded.train_batch(X, 0.3), m.train_batch(X, 0.3))
    assert np.array_equal(loaded.params(), m.params()) and not np.array_equal(before, m.params())
    m.set_params(before)


@pytest.mark.parametrize('cc', COMPILERS)
def test_nn_c_built_by_hand_with_plain_flags_gives_the_same_bits(trained, tmp_path, cc):
    """The source carries its own floating-point contract: -O0...-O3 and
    -march=native, without -ffp-contract=off, give the interpreter's bits."""
    m, folder = trained
    include = sysconfig.get_paths()['include']
    expected = run_bare(folder, X[:4], tmp_path)
    for flags in (['-O0'], ['-O1'], ['-O2'], ['-O3'], ['-O2', '-march=native']):
        if cc == 'tcc' and flags != ['-O0']:
            continue      # tcc has no levels
        out = tmp_path / '-'.join(f.strip('-') for f in flags)
        out.mkdir()
        shutil.copy(folder / 'nn.c', out)
        r = subprocess.run([cc, *flags, '-shared', '-fPIC', '-DNN_PYTHON', '-I', include, 'nn.c', '-o', 'nn.abi3.so',
                            '-lm'], cwd=out, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert run_bare(out, X[:4], tmp_path) == expected, (cc, flags)


@pytest.mark.parametrize('cc', [c for c in COMPILERS if c != 'tcc'])
def test_fast_math_is_refused_by_the_source_itself(trained, tmp_path, cc):
    m, folder = trained
    include = sysconfig.get_paths()['include']
    r = subprocess.run([cc, '-O2', '-ffast-math', '-shared', '-fPIC', '-DNN_PYTHON', '-I', include,
                        str(folder / 'nn.c'), '-o', str(tmp_path / 'x.so')], capture_output=True, text=True)
    assert r.returncode != 0 and 'fast-math' in r.stderr


def copy_of(folder, tmp_path, name):
    target = tmp_path / name
    shutil.copytree(folder, target)
    return target


def test_a_foreign_shared_object_is_rebuilt_from_nn_c(trained, tmp_path):
    m, folder = trained
    other = copy_of(folder, tmp_path, 'other')
    x = Value(0.0)
    compiler.compile(x * 2.0, [x], cc=FAST_CC).export(tmp_path / 'tiny')
    shutil.copy(tmp_path / 'tiny' / 'nn.abi3.so', other / 'nn.abi3.so')
    loaded = compiler.load(other)             # the checksum in nn.json does not match: rebuilt
    assert loaded.module.program_hash == m.module.program_hash
    assert np.array_equal(loaded.params(), m.params())


def test_a_truncated_shared_object_is_rebuilt(trained, tmp_path):
    m, folder = trained
    other = copy_of(folder, tmp_path, 'cut')
    data = (other / 'nn.abi3.so').read_bytes()
    (other / 'nn.abi3.so').write_bytes(data[:len(data) // 3])
    assert np.array_equal(compiler.load(other).predict(X), m.predict(X))


def test_without_a_compiler_a_mismatch_is_named(trained, tmp_path, monkeypatch):
    m, folder = trained
    other = copy_of(folder, tmp_path, 'noc')
    info = json.loads((other / 'nn.json').read_text())
    info['platform'] = 'win32-ARM64'
    (other / 'nn.json').write_text(json.dumps(info))
    monkeypatch.setenv('PATH', str(tmp_path / 'empty'))
    monkeypatch.delenv('CC', raising=False)
    with pytest.raises(ExportError, match='built for win32-ARM64.*needs a C compiler'):
        compiler.load(other)


@pytest.mark.parametrize('damage, words', [
    (lambda f: os.remove(f / 'nn.json'), 'no nn.json'),
    (lambda f: (f / 'nn.json').write_text('{"format": 99}'), 'format 99'),
    (lambda f: (f / 'nn.json').write_text('not json'), 'not readable as JSON'),
    (lambda f: ((f / 'nn.abi3.so').write_bytes(b''), (f / 'nn.c').write_text('int x;')),
     'nn.c is not the program'),
])
def test_a_folder_that_is_not_a_usable_export_is_refused_clearly(trained, tmp_path, damage, words):
    m, folder = trained
    other = copy_of(folder, tmp_path, 'bad')
    damage(other)
    with pytest.raises(ExportError, match=words):
        compiler.load(other)


def test_a_folder_that_is_not_an_export(tmp_path):
    with pytest.raises(ExportError, match='not an exported model'):
        compiler.load(tmp_path)
    with pytest.raises(ExportError, match='not a folder'):
        compiler.load(tmp_path / 'missing')


def edited_json(**changes):
    def damage(folder):
        info = json.loads((folder / 'nn.json').read_text())
        info.update(changes)
        (folder / 'nn.json').write_text(json.dumps(info))
    return damage


@pytest.mark.parametrize('damage, words', [
    (edited_json(n_params=7), 'nn.json says n_params 7, the module has 53'),
    (edited_json(n_inputs=8), 'nn.json says n_inputs 8, the module has 9'),
    (edited_json(n_outputs=4), 'nn.json says n_outputs 4'),
    (edited_json(features=[0, 1]), "nn.json's features are not the module's"),
    (edited_json(param_labels=['p0']), "nn.json's param_labels must be 53 strings, one per param, got 1"),
    (edited_json(input_labels='x'), "nn.json's input_labels must be 9 strings"),
], ids=['n_params', 'n_inputs', 'n_outputs', 'features', 'param_labels', 'input_labels'])
def test_nn_json_must_describe_the_module_it_sits_beside(trained, tmp_path, damage, words):
    """Sizes, features and labels in nn.json are checked against the loaded
    module: a param_labels of the wrong length would make save_weights write
    the wrong labels."""
    m, folder = trained
    other = copy_of(folder, tmp_path, 'edited')
    damage(other)
    with pytest.raises(ExportError, match=words):
        compiler.load(other)


def test_the_readmes_standard_library_example_runs_and_predicts(trained, tmp_path):
    """The README's ``import nn`` block, run as written in a bare Python
    (no site-packages), with a print of what predict wrote."""
    m, folder = trained
    readme = (pathlib.Path(__file__).resolve().parent.parent / 'README.md').read_text()
    block = readme.split("```python\nimport array, sys\n", 1)[1].split('```', 1)[0]
    code = "import array, sys\n" + block.replace("'DIR'", repr(str(folder)))
    assert 'nn.predict(X, out)' in code
    code += "print(out.tolist())\n"
    r = subprocess.run([sys.executable, '-I', '-S', '-c', code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    printed = [float(x) for x in r.stdout.split('\n', 1)[1].replace('[', ' ').replace(']', ' ')
               .replace(',', ' ').split()]
    fresh = compiler.load(folder)       # the module as exported, before the example's update
    assert printed == fresh.predict(np.zeros((2, 9))).ravel().tolist()
