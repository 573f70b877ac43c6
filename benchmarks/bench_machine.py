"""The machine a benchmark ran on: CPU, cores, memory, load, versions, commit;
and a cold build cache to time compiles from."""
import contextlib
import importlib.metadata
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

import compiler
from compiler.build.process import usable_cores   # the cores compiler.compile's threads default to

REPO = Path(__file__).resolve().parent.parent
TOOLCHAINS = ('tcc', 'clang', 'gcc')


def proc_field(path, key):
    """The text after ``key:`` on the first line of ``path`` that starts with ``key``, or None."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags(wanted=('avx2', 'fma', 'avx512f')):
    have = set((proc_field('/proc/cpuinfo', 'flags') or '').split())
    return [w for w in wanted if w in have]


def mem_total_gb():
    kb = proc_field('/proc/meminfo', 'MemTotal:')
    return round(int(kb.split()[0]) / 2**20, 1) if kb else None


def git_commit():
    def git(*words):
        return subprocess.run(['git', *words], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    try:
        head = git('rev-parse', '--short', 'HEAD')
        dirty = git('status', '--porcelain', '--untracked-files=no')
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (head + ('+dirty' if dirty else '')) or None


def package_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def compiler_versions():
    versions = {}
    for name in TOOLCHAINS:
        try:
            versions[name] = compiler.find_compiler(name).version
        except compiler.CompilerNotFound:
            versions[name] = None
    return versions


def machine():
    return {
        'cpu': proc_field('/proc/cpuinfo', 'model name') or platform.processor() or platform.machine(),
        'cpu_flags': cpu_flags(),
        'cores': os.cpu_count(),
        'cores_usable': usable_cores(),
        'mem_gb': mem_total_gb(),
        'loadavg': [round(x, 2) for x in os.getloadavg()],
        'os': platform.platform(),
        'python': platform.python_version(),
        'numpy': np.__version__,
        'torch': package_version('torch'),
        'compilers': compiler_versions(),
        'git': git_commit(),
    }


def busy_seconds():
    """CPU seconds this machine has spent busy (or stolen by the hypervisor), or None."""
    try:
        with open('/proc/stat') as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf('SC_CLK_TCK')


def load_probe():
    """A reading for ``other_load``: wall clock, machine busy, this process's CPU seconds."""
    own = os.times()
    return time.perf_counter(), busy_seconds(), own.user + own.system


def other_load(start):
    """How many CPUs other work (other processes, the hypervisor) kept busy
    on average since ``start`` (a ``load_probe()``), or None."""
    wall, busy, own = start
    wall_now, busy_now, own_now = load_probe()
    if busy is None or busy_now is None or wall_now <= wall:
        return None
    return max(0.0, (busy_now - busy - (own_now - own)) / (wall_now - wall))


@contextlib.contextmanager
def cold_cache(prefix='bench-'):
    """An empty build cache, as on a first compile (``$MICROGRAD_CACHE_DIR``
    a new temporary folder, put back after; a module built inside stays
    loaded after its folder is gone): nothing the cache held before is found."""
    old = os.environ.get('MICROGRAD_CACHE_DIR')
    with tempfile.TemporaryDirectory(prefix=prefix) as cache:
        os.environ['MICROGRAD_CACHE_DIR'] = cache
        try:
            yield
        finally:
            if old is None:
                os.environ.pop('MICROGRAD_CACHE_DIR', None)
            else:
                os.environ['MICROGRAD_CACHE_DIR'] = old
