"""``benchmarks/bench_mnist.py`` runs end to end and reports every field.

Nothing here is about speed: benchmarks are programs, their numbers are read
by people. What is checked is that a quick run completes, that its JSON has
every field, and that all systems measured the same model (the same loss on
the first image at the initial weights).
"""
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / 'benchmarks' / 'bench_mnist.py'

MACHINE_FIELDS = {'cpu', 'cpu_flags', 'cores', 'cores_usable', 'mem_gb', 'loadavg', 'os',
                  'python', 'numpy', 'torch', 'compilers', 'git'}
CONFIG_FIELDS = {'data', 'images', 'batch', 'repeats', 'lr', 'interp_images', 'quick',
                 'compile_timeout', 'builds', 'model'}
GRAPH_FIELDS = {'build_s', 'trace_s', 'codegen_s', 'ops', 'slots', 'params', 'c_lines', 'c_bytes'}
ROW_FIELDS = {'name', 'kind', 'status', 'note', 'compile_s', 'images', 'repeats', 'pass_seconds',
              'images_per_s', 's_per_epoch', 'speedup_vs_torch_per_sample', 'speedup_vs_torch_batched', 'loss0',
              'first_batch_loss', 'trained_loss'}
BUILD_FIELDS = {'kwargs', 'toolchain', 'version', 'flags', 'passes', 'trace_s', 'passes_s',
                'codegen_s', 'load_s', 'c_lines', 'c_bytes', 'compiler_peak_mb'}


def load_bench():
    spec = importlib.util.spec_from_file_location('bench_mnist', BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_reports_every_field(tmp_path):
    out = tmp_path / 'bench.json'
    r = subprocess.run([sys.executable, str(BENCH), '--quick', '--builds', 'tcc', '--json', str(out)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert 'machine:' in r.stdout and 'tcc' in r.stdout
    report = json.loads(out.read_text())

    assert MACHINE_FIELDS <= report['machine'].keys()
    assert set(report['machine']['compilers']) == {'tcc', 'clang', 'gcc'}
    assert CONFIG_FIELDS <= report['config'].keys()
    assert report['config']['quick'] is True and report['config']['builds'] == ['tcc']
    assert GRAPH_FIELDS <= report['graph'].keys()
    assert report['graph']['c_lines'] > 0 and report['graph']['c_bytes'] > 0

    rows = {row['name']: row for row in report['results']}
    assert set(rows) == {'micrograd', 'torch per-sample', 'torch batched', 'tcc'}
    for row in rows.values():
        assert ROW_FIELDS <= row.keys(), row['name']
    assert BUILD_FIELDS <= rows['tcc'].keys()

    interp = rows['micrograd']
    assert interp['status'] == 'ok' and interp['images_per_s'] > 0
    tcc = rows['tcc']
    if tcc['status'] == 'not installed':
        return
    assert tcc['status'] == 'ok', tcc['note']
    assert tcc['images'] == 1000 and len(tcc['pass_seconds']) == 2
    assert tcc['images_per_s'] > 0 and tcc['compile_s'] > 0
    assert tcc['toolchain'] == 'tcc' and tcc['kwargs'] == load_bench().BUILDS['tcc']
    assert 'vectorize' not in tcc['passes']         # the plain rows are the straight-line program
    assert tcc['loss0'] == interp['loss0']          # the compiled graph is the interpreter's, exactly
    torch = rows['torch per-sample']
    if torch['status'] == 'ok':
        assert math.isclose(torch['loss0'], interp['loss0'], rel_tol=1e-12)
        assert tcc['speedup_vs_torch_per_sample'] > 0
        assert torch['speedup_vs_torch_per_sample'] == 1.0
        batched = rows['torch batched']
        assert batched['speedup_vs_torch_batched'] == 1.0
        assert math.isclose(tcc['speedup_vs_torch_batched'],
                            tcc['images_per_s'] / batched['images_per_s'])


def test_build_entries_pass_only_their_own_keywords():
    bench = load_bench()
    assert bench.compile_kwargs({'cc': 'tcc'}, 7) == {'cc': 'tcc', 'timeout': 7}
    entry = {'cc': 'clang', 'opt': '-O2', 'vectorize': True}
    assert bench.compile_kwargs(entry, 7) == {**entry, 'timeout': 7}
    assert bench.compile_kwargs({'cc': 'gcc', 'timeout': 1}, 7)['timeout'] == 1
    assert bench.unsupported_kwargs({'cc': 'tcc', 'opt': '-O1'}) == []
    assert bench.unsupported_kwargs({'cc': 'tcc', 'no_such_keyword': 1}) == ['no_such_keyword']
    # switching off a feature the compiler does not have asks for nothing
    assert bench.unsupported_kwargs({'cc': 'tcc', 'no_such_switch': False}) == []
    assert bench.compile_kwargs({'cc': 'tcc', 'no_such_switch': False}, 7) == {'cc': 'tcc', 'timeout': 7}


def test_unknown_build_is_an_error():
    r = subprocess.run([sys.executable, str(BENCH), '--builds', 'tcc,clang-O9'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and 'clang-O9' in r.stderr
