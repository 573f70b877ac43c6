"""The compiled model as a standalone artifact: a folder that ``import nn``
works from, with neither ``micrograd`` nor ``compiler`` installed.

``export(model, folder)`` writes:

- ``nn.c``: the exact C source, with the model's current parameters as the
  module's initial ones; it states its own floating-point contract, so
  building it by hand (``cc -O2 -shared -fPIC -I$(python3-config
  --includes) nn.c -o nn.abi3.so``) gives the same bits;
- ``nn.abi3.so``: that source built (CPython's stable ABI, 3.11 and later),
  so ``sys.path.insert(0, folder); import nn`` works;
- ``nn.json``: what it is (``FORMAT``'s keys, below).

``load(folder)`` returns a ``CompiledModel`` from such a folder, checking
``nn.json`` against the shared object and rebuilding it from ``nn.c`` when it
does not fit this interpreter and a C compiler is present.
"""
import json
import os
import platform
import shutil
import sys

from compiler.build import (BuildError, Build, build_extension, default_flags, elf_problem,
                            find_compiler, program_hash)
from compiler.codegen import GENERATOR_VERSION, emit_module
from compiler.files import atomic_write, sha256_file
from compiler.load import load_module

FORMAT = 1
SO_NAME = 'nn.abi3.so'
PYTHON_ABI = 'cp311-abi3'      # Py_LIMITED_API 0x030B0000 in compiler/templates/contract.h


class ExportError(ValueError):
    """A folder is not a usable export, and says what does not match."""


def _platform():
    return f'{sys.platform}-{platform.machine()}'


def export(model, folder):
    """Write ``folder`` (created if needed) with ``nn.c``, ``nn.abi3.so`` and
    ``nn.json`` for ``model``, its current parameters built in."""
    if model.program is None:
        raise ExportError("export(): this model was itself loaded from an export; copy that folder instead")
    params = model.params()
    source = emit_module(model.program, optimizer=model.optimizer, initial_params=params.tolist())
    build = build_extension(source, model.build.toolchain, model.build.flags,
                            straight_flags=model.build.straight_flags,
                            straight_toolchain=model.build.straight_toolchain)
    os.makedirs(folder, exist_ok=True)
    try:
        with atomic_write(os.path.join(folder, 'nn.c'), 'w') as f:
            f.write(source)
        with atomic_write(os.path.join(folder, SO_NAME)) as f, open(build.path, 'rb') as so:
            shutil.copyfileobj(so, f)
    finally:
        if build.temporary:
            shutil.rmtree(os.path.dirname(build.path), ignore_errors=True)
    tc = model.build.toolchain
    info = {
        'format': FORMAT, 'generator': f'micrograd-compiler {GENERATOR_VERSION}',
        'program_hash': model.module.program_hash, 'graph_hash': model.module.graph_hash,
        'n_inputs': model.n_inputs, 'n_params': model.n_params, 'n_outputs': model.n_outputs,
        'input_labels': model.input_labels, 'param_labels': model.param_labels,
        'features': list(model.features), 'optimizer': model.module.optimizer,
        'compiler': {'family': tc.family, 'version': tc.version, 'path': tc.path},
        'flags': list(model.build.flags),
        'straight_flags': list(model.build.straight_flags or model.build.flags),
        'straight_compiler': (model.build.straight_toolchain or tc).version,
        'platform': _platform(), 'python_abi': PYTHON_ABI,
        'so_sha256': sha256_file(os.path.join(folder, SO_NAME)),
    }
    with atomic_write(os.path.join(folder, 'nn.json'), 'w') as f:
        # one key per line, each value on its line (long label lists stay one line)
        f.write('{\n' + ',\n'.join(f' {json.dumps(k)}: {json.dumps(v)}' for k, v in info.items()) + '\n}\n')
    return folder


def read_info(folder):
    """``nn.json`` of an export, checked for the keys this version needs."""
    path = os.path.join(folder, 'nn.json')
    if not os.path.isdir(folder):
        raise ExportError(f"{folder}: not a folder")
    try:
        with open(path) as f:
            info = json.load(f)
    except FileNotFoundError:
        raise ExportError(f"{folder} is not an exported model: it has no nn.json") from None
    except (OSError, ValueError) as e:
        raise ExportError(f"{path}: not readable as JSON ({e})") from None
    if not isinstance(info, dict) or info.get('format') != FORMAT:
        got = info.get('format') if isinstance(info, dict) else type(info).__name__
        raise ExportError(f"{path}: format {got!r}; this version of the compiler reads format {FORMAT}")
    needed = ('program_hash', 'n_inputs', 'n_params', 'n_outputs', 'input_labels', 'param_labels',
              'platform', 'python_abi', 'so_sha256', 'flags', 'compiler')
    missing = [k for k in needed if k not in info]
    if missing:
        raise ExportError(f"{path}: missing {', '.join(missing)}")
    return info


def _mismatch(folder, info):
    """Why the export's shared object does not fit this interpreter, or None."""
    so = os.path.join(folder, SO_NAME)
    if not os.path.isfile(so):
        return f'{SO_NAME} is missing'
    if info['platform'] != _platform():
        return f"it was built for {info['platform']}, this is {_platform()}"
    if info['python_abi'] != PYTHON_ABI or sys.implementation.name != 'cpython' or sys.version_info < (3, 11):
        return (f"it needs CPython >= 3.11 ({info['python_abi']}), this is "
                f"{sys.implementation.name} {platform.python_version()}")
    if sha256_file(so) != info['so_sha256']:
        return f'{SO_NAME} is not the file nn.json describes (its SHA-256 differs)'
    problem = elf_problem(so)
    return f'{SO_NAME}: {problem}' if problem else None


def load(folder, cc=None, threads=None):
    """A ``CompiledModel`` from an exported folder (no graph needed).

    The shared object is checked against ``nn.json`` (checksum, platform,
    Python ABI, and after loading its ``program_hash``); when it does not
    fit and a C compiler is found (``cc``, ``$CC`` or the best installed),
    it is rebuilt from ``nn.c`` (whose own ``program_hash`` must match) into
    the build cache. Otherwise ``ExportError`` says what does not match.
    """
    from compiler.model import CompiledModel, resolve_threads
    info = read_info(folder)
    problem = _mismatch(folder, info)
    build = None
    if problem is None:
        module = load_module(os.path.join(folder, SO_NAME))
        if getattr(module, 'program_hash', None) != info['program_hash']:
            problem = (f"{SO_NAME} reports program_hash {getattr(module, 'program_hash', None)}, "
                       f"nn.json {info['program_hash']}")
        else:
            build = Build(os.path.join(folder, SO_NAME), None, True, False, None, info['flags'])
    source_path = os.path.join(folder, 'nn.c')
    try:
        with open(source_path) as f:
            source = f.read()
    except OSError as e:
        if problem:
            raise ExportError(f"{folder}: {problem}, and nn.c cannot be read to rebuild it ({e})") from None
        source = None
    if problem is not None:
        if program_hash(source) != info['program_hash']:
            raise ExportError(f"{folder}: {problem}, and nn.c is not the program nn.json describes "
                              f"(program_hash {program_hash(source)} != {info['program_hash']})")
        try:
            toolchain = find_compiler(cc)
        except BuildError as e:
            raise ExportError(f"{folder}: {problem}; rebuilding it from nn.c needs a C compiler: "
                              f"{str(e).splitlines()[0]}") from None
        build = build_extension(source, toolchain, default_flags(toolchain))
        module = load_module(build.path)
        if build.temporary:
            shutil.rmtree(os.path.dirname(build.path), ignore_errors=True)
    model = CompiledModel(module, None, build, {}, source, input_labels=info['input_labels'],
                          param_labels=info['param_labels'])
    model.export_info = info
    model.threads = resolve_threads(threads)
    return model
