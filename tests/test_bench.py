"""``benchmarks/bench_mnist.py`` runs end to end and reports every field.

Nothing here is about speed: benchmarks are programs, their numbers are read
by people. What is checked is that a quick run completes, that its JSON has
every field, that all systems measured the same model (our rows the
interpreter's loss on the first image, exactly; PyTorch our initial weights),
that our rows give the same bits at 1 thread and at all threads, and that a
row failing those checks fails loudly.
"""
import copy
import importlib.util
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / 'benchmarks' / 'bench_mnist.py'

MACHINE_FIELDS = {'cpu', 'cpu_flags', 'cores', 'cores_usable', 'mem_gb', 'loadavg', 'loadavg_end', 'os',
                  'python', 'numpy', 'torch', 'compilers', 'git', 'peaks'}
CONFIG_FIELDS = {'data', 'images', 'batch', 'lr', 'seed', 'repeats', 'rounds', 'threads', 'models', 'builds',
                 'systems', 'interp_images', 'quick', 'compile_timeout', 'min_predict_pass_s'}
ROW_FIELDS = {'model', 'system', 'kind', 'status', 'note', 'images', 'repeats', 'rounds', 'other_load',
              'train_1t', 'train_all', 'predict_1t', 'predict_all',
              'speedup_1t', 'speedup_all', 'predict_speedup_1t', 'predict_speedup_all', 'thread_speedup',
              'loss0', 'loss0_minus_interpreter', 'first_batch_loss_1t', 'first_batch_loss_all',
              'bits_identical', 'trained_loss', 'init_params_sha256'}
BUILD_FIELDS = {'kwargs', 'toolchain', 'version', 'flags', 'passes', 'compile_s', 'timings',
                'ops', 'c_lines', 'c_bytes', 'compiler_peak_mb', 'macs_executed', 'macs_dense'}
TIMING_FIELDS = {'threads', 'pass_seconds', 'pass_images', 'images_per_s', 's_per_epoch'}


def load_bench(name='bench_mnist'):
    spec = importlib.util.spec_from_file_location(name, BENCH.with_name(f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_bench(*words, timeout=120):
    return subprocess.run([sys.executable, str(BENCH), *words], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope='module')
def quick(tmp_path_factory):
    """The CI smoke run, once: its JSON report and the JSON's path."""
    out = tmp_path_factory.mktemp('bench') / 'bench.json'
    r = run_bench('--quick', '--json', str(out))
    assert r.returncode == 0, r.stderr
    assert 'machine:' in r.stdout and 'checks: all passed' in r.stdout
    return json.loads(out.read_text()), out


def rows_of(report):
    return {row['system']: row for row in report['results']}


def test_quick_run_reports_every_field(quick):
    report, _ = quick
    assert MACHINE_FIELDS <= report['machine'].keys()
    assert set(report['machine']['compilers']) == {'tcc', 'clang', 'gcc'}
    config = report['config']
    assert CONFIG_FIELDS <= config.keys()
    assert config['quick'] is True and config['models'] == ['784-50-10']
    assert config['builds'] == ['tcc', 'clang-O0'] and config['images'] == 1000 and config['rounds'] == 1
    assert config['threads']['1t'] == 1 and config['threads']['all'] == report['machine']['cores_usable']
    assert report['failures'] == []

    rows = rows_of(report)
    assert set(rows) == {'micrograd', 'torch', 'tcc', 'clang-O0'}
    for row in rows.values():
        assert ROW_FIELDS <= row.keys(), row['system']
        assert row['model'] == '784-50-10'
    interp = rows['micrograd']
    assert interp['status'] == 'ok' and interp['train_1t']['images_per_s'] > 0


def test_kernel_work_is_counted_against_the_dense_work(quick):
    """Each build's rows say how many multiply-adds its kernels ran per image
    (skipping zero pixels: fewer than dense, never more) and the peaks of the
    machine are in the report."""
    report, _ = quick
    for build in ('tcc', 'clang-O0'):
        row = rows_of(report)[build]
        dense, run = row['macs_dense'], row['macs_executed']
        assert dense == {'forward': 784 * 50 + 50 * 10, 'input_grad': 50 * 10, 'weight_grad': 784 * 50 + 50 * 10}
        assert set(run) == set(dense)
        for kind in dense:
            assert 0 < run[kind] <= dense[kind], (build, kind)
        assert run['forward'] < 0.9 * dense['forward'], "blank pixels were not skipped"
    peaks = report['machine']['peaks']
    if report['machine']['cpu_flags']:
        assert all(rate > 0 for by_t in peaks.values() for rate in by_t.values())


@pytest.mark.parametrize('build', ['tcc', 'clang-O0'])
def test_our_rows_are_exact_at_every_thread_count(quick, build):
    report, _ = quick
    rows = rows_of(report)
    row, interp = rows[build], rows['micrograd']
    if row['status'] == 'not installed':
        pytest.skip(row['note'])
    assert row['status'] == 'ok', row['note']
    assert BUILD_FIELDS <= row.keys()
    assert row['kwargs'] == load_bench('bench_systems').BUILDS[build]
    assert row['toolchain'] == row['kwargs']['cc'] and 'vectorize' in row['passes']
    assert row['compile_s'] >= row['timings']['compile'] > 0 and row['c_lines'] > 0
    assert row['loss0'] == interp['loss0'] and row['loss0_minus_interpreter'] == 0
    assert row['bits_identical'] is True
    assert row['first_batch_loss_1t'] == row['first_batch_loss_all']
    for key, threads in (('1t', 1), ('all', report['config']['threads']['all'])):
        for timing in (row[f'train_{key}'], row[f'predict_{key}']):
            assert TIMING_FIELDS <= timing.keys()
            assert timing['threads'] == threads and len(timing['pass_seconds']) == 2
            assert timing['images_per_s'] > 0
        assert row[f'train_{key}']['pass_images'] == [1000, 1000]
    assert math.isclose(row['thread_speedup'], row['train_1t']['s_per_epoch'] / row['train_all']['s_per_epoch'])


@pytest.mark.torch
def test_torch_starts_from_our_weights_and_ratios_are_against_it(quick):
    report, _ = quick
    rows = rows_of(report)
    torch = rows['torch']
    if torch['status'] == 'skipped':
        pytest.skip(torch['note'])
    assert torch['status'] == 'ok', torch['note']
    assert math.isclose(torch['loss0'], rows['micrograd']['loss0'], rel_tol=1e-12)
    assert torch['speedup_1t'] == torch['speedup_all'] == 1.0
    for ours in (r for r in rows.values() if r['kind'] == 'compiled' and r['status'] == 'ok'):
        assert ours['init_params_sha256'] == torch['init_params_sha256']
        assert math.isclose(ours['first_batch_loss_1t'], torch['first_batch_loss_1t'], rel_tol=1e-9)
        for key in ('1t', 'all'):
            assert math.isclose(ours[f'speedup_{key}'],
                                torch[f'train_{key}']['s_per_epoch'] / ours[f'train_{key}']['s_per_epoch'])
            assert math.isclose(ours[f'predict_speedup_{key}'],
                                ours[f'predict_{key}']['images_per_s'] / torch[f'predict_{key}']['images_per_s'])


def test_markdown_tables_from_the_json(quick):
    report, path = quick
    r = run_bench('--from-json', str(path), '--markdown', timeout=60)
    assert r.returncode == 0, r.stderr
    assert ('| model | PyTorch 1T | PyTorch all | ours tcc 1T | ours tcc all | ours clang-O0 1T | '
            'ours clang-O0 all | ratio 1T | ratio all |') in r.stdout
    # training, predict, compile time; and the kernel work of each build
    assert r.stdout.count('\n| 784-50-10 |') == 3 + 2
    assert 'images per second' in r.stdout and '`compile()` seconds' in r.stdout


def test_a_row_whose_bits_differ_fails_loudly(quick):
    report, _ = quick
    report = copy.deepcopy(report)
    rows = rows_of(report)
    rows['tcc'].update(status='ok', bits_identical=False, first_batch_loss_1t=1.0, first_batch_loss_all=2.0)
    rows['clang-O0'].update(status='ok', bits_identical=True,
                            loss0=math.nextafter(rows['micrograd']['loss0'], math.inf))
    failures = load_bench('bench_report').analyse(report)
    assert rows['tcc']['status'] == rows['clang-O0']['status'] == 'FAILED'
    assert any('784-50-10 tcc: 1 thread and all threads differ' in f for f in failures)
    assert any('784-50-10 clang-O0: loss of image 0' in f for f in failures)
    assert 'FAILED' in load_bench('bench_report').text(report)


def test_build_entries_pass_only_their_own_keywords():
    bench = load_bench('bench_systems')
    assert bench.compile_kwargs({'cc': 'tcc'}, 7) == {'cc': 'tcc', 'timeout': 7}
    entry = {'cc': 'clang', 'opt': '-O2', 'vectorize': True}
    assert bench.compile_kwargs(entry, 7) == {**entry, 'timeout': 7}
    assert bench.compile_kwargs({'cc': 'gcc', 'timeout': 1}, 7)['timeout'] == 1
    assert bench.unsupported_kwargs({'cc': 'tcc', 'opt': '-O1'}) == []
    assert bench.unsupported_kwargs({'cc': 'tcc', 'no_such_keyword': 1}) == ['no_such_keyword']
    # switching off a feature the compiler does not have asks for nothing
    assert bench.unsupported_kwargs({'cc': 'tcc', 'no_such_switch': False}) == []
    assert bench.compile_kwargs({'cc': 'tcc', 'no_such_switch': False}, 7) == {'cc': 'tcc', 'timeout': 7}


@pytest.mark.parametrize('words, named', [(['--builds', 'tcc,clang-O9'], 'clang-O9'),
                                          (['--models', '784-50-9'], '784-50-9'),
                                          (['--models', '784-x-10'], '784-x-10')])
def test_unknown_build_or_model_is_an_error(words, named):
    r = run_bench(*words, timeout=60)
    assert r.returncode == 2 and named in r.stderr


def test_rounds_pool_their_passes_and_their_checks(quick):
    report, _ = quick
    merge_rounds = load_bench('bench_systems').merge_rounds
    first = next(r for r in report['results'] if r['kind'] == 'compiled' and r['status'] == 'ok')
    second = copy.deepcopy(first)
    second['train_1t']['pass_seconds'] = [s * 3 for s in first['train_1t']['pass_seconds']]
    merged = merge_rounds([first, second])
    assert merged['rounds'] == 2 and merged['bits_identical'] is True
    assert merged['train_1t']['pass_seconds'] == first['train_1t']['pass_seconds'] + second['train_1t']['pass_seconds']
    assert merged['train_1t']['pass_images'] == [1000] * 4
    assert merged['train_1t']['images_per_s'] == statistics.median(1000 / s for s in merged['train_1t']['pass_seconds'])
    second['first_batch_loss_all'] = math.nextafter(first['first_batch_loss_all'], math.inf)
    assert merge_rounds([first, second])['bits_identical'] is False
    failed = dict(second, status='timeout', note='worker killed')
    assert merge_rounds([first, failed]) is failed
