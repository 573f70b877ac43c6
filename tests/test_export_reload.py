"""``compiler.load`` after the folder changed under it, and how it rebuilds:
the bytes it loads are the bytes it checked (never code an earlier ``import
nn`` left open), a rebuild from ``nn.c`` is built as the export was (the
compiler and levels ``nn.json`` records, not plain -O2), and the model's
``build.path`` never names a removed folder. Real files, real exports, a
real second Python."""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import compiler
from compiler.build import COMPILE_SECONDS, choice as choosing
from compiler.load import ChangedFile, load_module

from tests.differential import COMPILERS, FAST_CC, assert_matches_interpreter, needs_cc
from tests.test_build_choice import chain_graph
from tests.test_export import X, small_mlp

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = needs_cc
SAMPLES = [[math.sin(k + i) for i in range(8)] for k in range(3)]

# export, `import nn` from the folder, train, export again into the same
# folder, compiler.load: the second export's weights, in a fresh process
REEXPORT = '''
import array, sys
import numpy as np
import compiler
from tests.test_export import X, small_mlp

folder, cc = sys.argv[1], sys.argv[2]
loss, inputs, params, outputs = small_mlp()
m = compiler.compile(loss, inputs, params, outputs, cc=cc)
m.export(folder)
sys.path.insert(0, folder)
import nn                                  # the first export's code stays open in this process
first = array.array('d', bytes(8 * nn.n_params))
nn.read_params(first)
m.train_batch(X, 0.3)
m.export(folder)                           # the same path, new bytes
loaded = compiler.load(folder)
print('same as the second export:', np.array_equal(loaded.params(), m.params()))
print('same as the first export:', np.array_equal(loaded.params(), np.array(first)))
print('predicts as the model:', np.array_equal(loaded.predict(X), m.predict(X)))
'''


def test_load_after_import_nn_and_a_second_export_returns_the_second(tmp_path):
    env = {**os.environ, 'PYTHONPATH': REPO}
    r = subprocess.run([sys.executable, '-c', REEXPORT, str(tmp_path / 'model'), FAST_CC], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ['same as the second export: True', 'same as the first export: False',
                                     'predicts as the model: True'], r.stdout + r.stderr


def test_load_module_loads_the_bytes_it_was_told_to_expect(tmp_path):
    """The file is copied and hashed before it is loaded: a checksum that does
    not match is refused, whatever the file's path or the code already open."""
    loss, inputs, params, outputs = small_mlp()
    m = compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)
    so = tmp_path / 'nn.so'
    shutil.copyfile(m.build.path, so)
    good = load_module(so, sha256=m.build.sha256)
    assert good.program_hash == m.module.program_hash and good.__file__ == str(so)
    with pytest.raises(ChangedFile, match='SHA-256'):
        load_module(so, sha256='0' * 64)
    x = compiler.compile((inputs[0] * 2.0), inputs[:1], cc=FAST_CC)
    shutil.copyfile(x.build.path, so)            # another program at the same path
    assert load_module(so).program_hash == x.module.program_hash
    assert not [f for f in os.listdir(tmp_path) if f != 'nn.so'], "no copy is left beside it"


def without_so(m, folder):
    m.export(folder)
    info = json.loads((folder / 'nn.json').read_text())
    os.remove(folder / 'nn.abi3.so')
    return info


@pytest.mark.skipif(not {'clang', 'gcc'} <= set(COMPILERS), reason="needs clang and gcc")
def test_a_rebuild_uses_the_recorded_compiler_and_flags(tmp_path, monkeypatch):
    """Exported with gcc -O1: rebuilt with gcc -O1, though clang is the default compiler."""
    monkeypatch.delenv('CC', raising=False)
    loss, inputs, params, outputs = small_mlp()
    m = compiler.compile(loss, inputs, params, outputs, cc='gcc', opt='-O1')
    info = without_so(m, tmp_path / 'model')
    loaded = compiler.load(tmp_path / 'model')
    assert loaded.build.toolchain.family == 'gcc' and loaded.build.flags == info['flags']
    assert loaded.build.flags[0] == '-O1'     # (the export's own build of nn.c, from the cache)
    assert np.array_equal(loaded.predict(X), m.predict(X))


@pytest.mark.skipif('clang' not in COMPILERS, reason="needs clang")
def test_a_rebuild_of_a_split_build_builds_nn_c_at_the_straight_line_level(tmp_path, monkeypatch):
    """The size-aware choice put the straight-line parts at -O0; nn.c is one
    unit, mostly those parts: rebuilt at -O0 (a 196-64-10 straight-line model:
    about 2 s, where plain -O2 took 51 s)."""
    monkeypatch.delenv('CC', raising=False)
    monkeypatch.setattr(choosing, 'COMPILE_BUDGET', 1e-9)
    monkeypatch.setattr(choosing, 'COMPILE_SECONDS', {**COMPILE_SECONDS, ('clang', '-O0'): 0.0})
    m = assert_matches_interpreter(chain_graph(), SAMPLES, [0.3, -0.7], 'clang')
    assert m.build.flags[0] == '-O1' and m.build.straight_flags[0] == '-O0'
    info = without_so(m, tmp_path / 'model')
    assert info['straight_flags'][0] == '-O0'
    monkeypatch.undo()                 # the rebuild does not depend on the budget of this process
    monkeypatch.delenv('CC', raising=False)
    loaded = compiler.load(tmp_path / 'model')
    assert loaded.build.toolchain.family == 'clang' and loaded.build.flags == info['straight_flags']
    for row in SAMPLES:
        m.set_input(row)
        loaded.set_input(row)
        assert m.forward() == loaded.forward()


@pytest.mark.skipif(not {'clang', 'tcc'} <= set(COMPILERS), reason="needs clang and tcc")
def test_a_rebuild_of_a_build_with_tcc_parts_uses_tcc(tmp_path, monkeypatch):
    monkeypatch.delenv('CC', raising=False)
    monkeypatch.setattr(choosing, 'COMPILE_BUDGET', 1e-9)
    monkeypatch.setattr(choosing, 'COMPILE_SECONDS', {**COMPILE_SECONDS, ('tcc', None): 0.0})
    monkeypatch.setattr(choosing, 'STATEMENTS_PER_CALL', 1e15)
    m = assert_matches_interpreter(chain_graph(), SAMPLES, [0.3, -0.7], None)
    assert m.build.straight_toolchain.family == 'tcc'
    without_so(m, tmp_path / 'model')
    monkeypatch.undo()
    monkeypatch.delenv('CC', raising=False)
    loaded = compiler.load(tmp_path / 'model')
    assert loaded.build.toolchain.family == 'tcc'


def test_a_rebuild_given_another_compiler_keeps_the_recorded_level(tmp_path, monkeypatch):
    monkeypatch.delenv('CC', raising=False)
    other = 'clang' if 'clang' in COMPILERS else next((cc for cc in COMPILERS if cc != 'gcc'), None)
    if 'gcc' not in COMPILERS or other is None:
        pytest.skip("needs gcc and another compiler")
    loss, inputs, params, outputs = small_mlp()
    m = compiler.compile(loss, inputs, params, outputs, cc='gcc', opt='-O1')
    without_so(m, tmp_path / 'model')
    loaded = compiler.load(tmp_path / 'model', cc=other)
    assert loaded.build.toolchain.family == other
    assert other == 'tcc' or loaded.build.flags[0] == '-O1'
    assert np.array_equal(loaded.predict(X), m.predict(X))


@pytest.mark.parametrize('cache', ['0', '1'])
def test_after_a_rebuild_the_build_path_is_a_file_or_none(tmp_path, monkeypatch, cache):
    monkeypatch.setenv('MICROGRAD_CACHE', cache)
    loss, inputs, params, outputs = small_mlp()
    m = compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)
    without_so(m, tmp_path / 'model')
    loaded = compiler.load(tmp_path / 'model', cc=FAST_CC)
    assert loaded.build.path is None or os.path.isfile(loaded.build.path), loaded.build.path
    assert (loaded.build.path is None) == (cache == '0')
    assert m.build.path is None or os.path.isfile(m.build.path)     # compile's build too
    assert np.array_equal(loaded.predict(X), m.predict(X))


def test_recorded_flags_that_are_not_a_list_of_strings_are_named(tmp_path):
    loss, inputs, params, outputs = small_mlp()
    m = compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)
    info = without_so(m, tmp_path / 'model')
    info['flags'] = '-O2 -shared'
    (tmp_path / 'model' / 'nn.json').write_text(json.dumps(info))
    with pytest.raises(compiler.ExportError, match='flags must be a list of strings'):
        compiler.load(tmp_path / 'model')
