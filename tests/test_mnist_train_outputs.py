"""mnist_train.py's output files: checked before any work, never two options
on one file, ``--load X --save X`` keeps ``X.bak``, the umask's permissions,
written through symlinks. Real files, real folders, real permissions."""
import json
import os
import stat

import numpy as np
import pytest

from tests.test_mnist_train import HAVE_MATPLOTLIB, TCC, run_main, saved_params, write_weights

N_PARAMS = 785 * 50 + 51 * 10
QUICK_RUN = [*TCC, '--limit', '300', '--epochs', '1']


def assert_refused_before_any_work(status, out, err, *phrases):
    assert status == 1
    assert out == '', 'nothing should be loaded, compiled or trained'
    assert err.startswith('error: ') and err.count('\n') == 1, err
    for phrase in phrases:
        assert phrase in err, err


@pytest.fixture
def folders(tmp_path):
    """``tmp_path`` with a regular file and a FIFO in it."""
    (tmp_path / 'file').write_text('not a folder')
    os.mkfifo(tmp_path / 'fifo')
    return tmp_path


@pytest.mark.parametrize('option, name, phrase', [
    ('save', 'missing/weights.npz', 'missing does not exist'),
    ('metrics', '.', 'is a folder; give a file name in it'),
    ('save', 'results/', 'is a folder; give a file name in it'),
    ('save', 'file/weights.npz', 'file is not a folder'),
    ('plot', 'file/curves.png', 'file is not a folder'),
    ('metrics', 'fifo', 'exists and is not a regular file'),
])
def test_a_bad_output_path_is_refused_before_any_work(folders, option, name, phrase):
    path = str(folders / name) + ('/' if name.endswith('/') else '')    # pathlib drops a final '/'
    status, out, err = run_main([*TCC, f'--{option}', path])
    assert_refused_before_any_work(status, out, err, f'error: --{option} {path}', phrase)
    assert stat.S_ISFIFO(os.stat(folders / 'fifo').st_mode), 'the FIFO is left alone'


@pytest.mark.skipif(os.geteuid() == 0, reason='root may write in a folder of mode 0555; '
                    'test_an_uncreatable_folder_is_refused checks a real refusal for root')
def test_an_unwritable_folder_is_refused(tmp_path):
    folder = tmp_path / 'read-only'
    folder.mkdir()
    folder.chmod(0o555)
    try:
        status, out, err = run_main([*TCC, '--save', folder / 'weights.npz'])
    finally:
        folder.chmod(0o755)
    assert_refused_before_any_work(status, out, err, f'cannot write in {folder} (Permission denied)')


@pytest.mark.skipif(not os.path.isdir('/sys/kernel'), reason='needs Linux sysfs')
def test_an_uncreatable_folder_is_refused():
    # sysfs refuses to create regular files, to root as well: the real error
    # of an unwritable folder (EACCES, or EROFS where /sys is mounted read-only).
    status, out, err = run_main([*TCC, '--metrics', '/sys/kernel/metrics.json'])
    assert_refused_before_any_work(status, out, err, 'error: --metrics /sys/kernel/metrics.json: '
                                                     'cannot write in /sys/kernel (')
    assert not os.path.exists('/sys/kernel/metrics.json')


@pytest.mark.parametrize('first, second', [('save', 'metrics'), ('metrics', 'plot'), ('load', 'metrics')])
def test_two_options_naming_one_file_are_refused(tmp_path, monkeypatch, first, second):
    # The same file spelled three ways: a symlink to it, a relative path, a dotted path.
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'sub').mkdir()
    (tmp_path / 'link.out').symlink_to(tmp_path / 'sub' / 'run.out')
    status, out, err = run_main([*TCC, f'--{first}', 'link.out', f'--{second}', f'{tmp_path}/sub/./run.out'])
    assert_refused_before_any_work(status, out, err, f"--{first} and --{second} both name "
                                                     f"{tmp_path / 'sub' / 'run.out'}")
    assert not (tmp_path / 'sub' / 'run.out').exists()


def saved_weights(path, seed):
    params = np.random.default_rng(seed).normal(0, 0.05, N_PARAMS)
    write_weights(path, params)
    return params


def test_saving_over_the_loaded_file_keeps_it_as_bak(tmp_path):
    weights, other = tmp_path / 'good.npz', tmp_path / 'other.npz'
    before = saved_weights(weights, seed=1)
    original = weights.read_bytes()
    # Saved elsewhere: nothing to keep.
    status, out, err = run_main([*QUICK_RUN, '--load', weights, '--save', other])
    assert status == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ['good.npz', 'other.npz']
    # Saved over the loaded file: the previous one becomes good.npz.bak.
    status, out, err = run_main([*QUICK_RUN, '--load', weights, '--save', weights])
    assert status == 0, err
    backup = tmp_path / 'good.npz.bak'
    assert f'saved weights to {weights} (the previous file is kept as {backup})' in out
    assert backup.read_bytes() == original
    trained = saved_params(weights)
    assert not np.array_equal(trained, before)
    np.testing.assert_array_equal(saved_params(backup), before)


def test_a_backup_path_that_is_a_folder_is_refused_before_any_work(tmp_path):
    weights = tmp_path / 'good.npz'
    saved_weights(weights, seed=1)
    (tmp_path / 'good.npz.bak').mkdir()
    status, out, err = run_main([*QUICK_RUN, '--load', weights, '--save', weights])
    assert_refused_before_any_work(status, out, err,
                                   f"keeps it as {tmp_path / 'good.npz.bak'}, which is a folder")


@pytest.fixture
def umask():
    """Sets the process's umask for a test, and restores it."""
    old = os.umask(0o022)
    yield lambda mask: os.umask(mask)
    os.umask(old)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize('mask, expected', [(0o022, 0o644), (0o002, 0o664)])
def test_saved_weights_get_the_umasks_permissions(tmp_path, umask, mask, expected):
    umask(mask)
    saved_weights(tmp_path / 'weights.npz', seed=0)
    assert mode(tmp_path / 'weights.npz') == expected


def test_a_run_writes_every_output_with_the_umasks_permissions_and_through_symlinks(tmp_path, umask):
    # Each output path is a symlink into another folder; the links must stay
    # links, the targets (one not there yet) get the files.
    umask(0o027)
    kept = tmp_path / 'kept'
    kept.mkdir()
    outputs = {'save': 'weights.npz', 'metrics': 'metrics.json'}
    if HAVE_MATPLOTLIB:
        outputs['plot'] = 'curves.png'
    argv = list(QUICK_RUN)
    for option, name in outputs.items():
        (tmp_path / name).symlink_to(kept / name)
        argv += [f'--{option}', tmp_path / name]
    (kept / 'weights.npz').write_bytes(b'an older file, replaced through the link')
    status, out, err = run_main(argv)
    assert status == 0, err
    for name in outputs.values():
        assert (tmp_path / name).is_symlink() and os.readlink(tmp_path / name) == str(kept / name)
        assert mode(kept / name) == 0o640, name
    assert saved_params(tmp_path / 'weights.npz').shape == (N_PARAMS,)
    assert json.loads((kept / 'metrics.json').read_text())['stopped'] == 'completed'
    assert sorted(p.name for p in kept.iterdir()) == sorted(outputs.values()), 'no temporary file left'


def test_saving_through_a_dangling_symlink_creates_its_target(tmp_path):
    link, target = tmp_path / 'weights.npz', tmp_path / 'store' / 'w.npz'
    target.parent.mkdir()
    link.symlink_to(target)
    params = saved_weights(link, seed=2)
    assert link.is_symlink()
    np.testing.assert_array_equal(saved_params(target), params)
