"""The compiled model as a standalone artifact: a folder that ``import nn``
works from, with neither ``micrograd`` nor ``compiler`` installed.

``export(model, folder)`` writes:

- ``nn.c``: the exact C source, with the model's current parameters as the
  module's initial ones; it states its own floating-point contract, so
  building it by hand (``cc -O2 -shared -fPIC -DNN_PYTHON $(python3-config
  --includes) nn.c -o nn.abi3.so``) gives the same bits; without
  ``-DNN_PYTHON`` it is plain C, the library ``nn.h`` declares;
- ``nn.h``: the C API of that plain C build (``emit_header``): sizes and
  ``nn_`` functions on a caller-owned state, for C programs and FFI;
- ``nn.abi3.so``: that source built (CPython's stable ABI, 3.11 and later),
  so ``sys.path.insert(0, folder); import nn`` works;
- ``nn.json``: what it is (``FORMAT``'s keys, below).

``open_folder(folder)`` reads such a folder back: it checks ``nn.json``
against the shared object, rebuilds it from ``nn.c`` when it does not fit
this interpreter and a C compiler is present, and returns what it found;
``compiler.model.load`` makes the ``CompiledModel`` of it (this module
never imports the model: data flows model -> export).
"""
import dataclasses
import json
import os
import platform
import shutil
import sys
from dataclasses import dataclass

from compiler.build import (OPT_LEVELS, BuildError, Build, BuildRequest, build_extension, default_flags,
                            elf_problem, find_compiler, program_hash)
from compiler.codegen import GENERATOR_VERSION, emit_header, emit_module
from compiler.cpu import ALL_SETS
from compiler.files import atomic_write, sha256_file
from compiler.load import ChangedFile, load_module

FORMAT = 1
SO_NAME = 'nn.abi3.so'
PYTHON_ABI = 'cp311-abi3'      # Py_LIMITED_API 0x030B0000 in compiler/templates/contract.h


class ExportError(ValueError):
    """A folder is not a usable export, and says what does not match."""


def _platform():
    return f'{sys.platform}-{platform.machine()}'


def export(model, folder):
    """Write ``folder`` (created if needed) with ``nn.c``, ``nn.h``,
    ``nn.abi3.so`` and ``nn.json`` for ``model``, its current parameters
    built in."""
    if model.program is None:
        raise ExportError("export(): this model was itself loaded from an export; copy that folder instead")
    params = model.params()
    # every instruction set, as in nn.c: the folder may be loaded on another CPU
    source = emit_module(model.program, optimizer=model.optimizer, initial_params=params.tolist(),
                         kernel_sets=ALL_SETS)
    build = build_extension(source, model.build.toolchain, model.build.flags,
                            straight_flags=model.build.straight_flags,
                            straight_toolchain=model.build.straight_toolchain)
    os.makedirs(folder, exist_ok=True)
    try:
        with atomic_write(os.path.join(folder, 'nn.c'), 'w') as f:
            f.write(source)
        with atomic_write(os.path.join(folder, 'nn.h'), 'w') as f:
            f.write(emit_header(source))
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
        'header': 'nn.h',
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


def _load_shipped(folder, info):
    """The export's own shared object as a module, exactly the bytes nn.json
    describes: (module, None), or (None, what is wrong)."""
    try:
        module = load_module(os.path.join(folder, SO_NAME), sha256=info['so_sha256'])
    except ChangedFile:
        return None, f'{SO_NAME} changed while it was being loaded'
    got = getattr(module, 'program_hash', None)
    if got != info['program_hash']:
        return None, f"{SO_NAME} reports program_hash {got}, nn.json {info['program_hash']}"
    return module, None


@dataclass(frozen=True)
class Found:
    """What ``open_folder`` found in an export: the loaded module, its build,
    the C source (None if unreadable) and ``nn.json``."""
    module: object
    build: object
    source: str
    info: dict


def open_folder(folder, cc=None):
    """The ``Found`` module of an exported folder (no graph needed).

    The shared object is checked against ``nn.json`` (checksum, platform,
    Python ABI, and after loading its ``program_hash``); when it does not
    fit and a C compiler is found (``cc``, ``$CC``, else the one the export
    was built with, else the best installed), it is rebuilt from ``nn.c``
    (whose own ``program_hash`` must match) into the build cache, as the
    export was built (``rebuild``). Otherwise ``ExportError`` says what does
    not match. The module loaded is always the bytes that were checked
    (``load_module`` with their checksum), never code an earlier ``import
    nn`` of the folder left open.
    """
    info = read_info(folder)
    problem = _mismatch(folder, info)
    build = None
    if problem is None:
        module, problem = _load_shipped(folder, info)
        if problem is None:
            build = Build(os.path.join(folder, SO_NAME), cmd=None, cached=True, temporary=False,
                          toolchain=None, flags=info['flags'], sha256=info['so_sha256'])
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
        build = rebuild(folder, info, source, cc, why=problem)
        try:
            module = load_module(build.path, sha256=build.sha256)
        finally:
            if build.temporary:
                shutil.rmtree(os.path.dirname(build.path), ignore_errors=True)
        if build.temporary:       # nothing is left to point to
            build = dataclasses.replace(build, path=None)
    return Found(module, build, source, info)


def rebuild(folder, info, source, cc=None, why='it must be rebuilt'):
    """The ``Build`` of the export's ``nn.c`` (``source``), built as nn.json
    says the export was: its compiler (``cc``, else ``$CC``, else the
    recorded one when it is on ``PATH``) and flags. ``nn.c`` is one
    translation unit; when the export's build compiled its straight-line
    parts otherwise (at a lower level, or with tcc: the size-aware choice of
    ``compiler.build.choose_build``, which keeps a large program's compile
    time in budget), those parts are most of it, so all of it is built that
    way. Another compiler than the recorded one gets its default flags at
    the recorded level. ``why``: what was wrong with the shared object."""
    recorded = info.get('compiler') if isinstance(info.get('compiler'), dict) else {}
    flags, version = _flags(folder, info, 'flags'), recorded.get('version')
    straight_flags = _flags(folder, info, 'straight_flags') if info.get('straight_flags') else flags
    straight_version = info.get('straight_compiler') or version
    if (straight_flags, straight_version) != (flags, version):
        flags, version = straight_flags, straight_version
    try:
        if cc is not None or os.environ.get('CC', '').strip():
            toolchain = find_compiler(cc)
        else:
            toolchain = _installed(version)
    except BuildError as e:
        raise ExportError(f"{folder}: {why}; rebuilding it from nn.c needs a C compiler: "
                          f"{str(e).splitlines()[0]}") from None
    if toolchain.version != version:
        level = next((f for f in flags if f in OPT_LEVELS), None)
        flags = default_flags(toolchain, level, native='-march=native' in flags)
    return build_extension(BuildRequest.of(source, toolchain, flags))


def _flags(folder, info, key):
    flags = info[key]
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise ExportError(f"{os.path.join(folder, 'nn.json')}: {key} must be a list of strings, not {flags!r}")
    return list(flags)


def _installed(version):
    """The compiler on ``PATH`` whose version text is ``version``, else one of
    the same family, else the best installed."""
    found = []
    for name in ('clang', 'gcc', 'tcc'):
        try:
            found.append(find_compiler(name))
        except BuildError:
            pass
    for toolchain in found:
        if toolchain.version == version:
            return toolchain
    words = set((version or '').split())        # 'Debian clang version 14.0.6', 'gcc (Debian 12.2.0-14) 12.2.0'
    for toolchain in found:
        if toolchain.family in words:
            return toolchain
    return found[0] if found else find_compiler(None)


def check_module(folder, info, module):
    """Raise ``ExportError`` unless the sizes ``nn.json`` states are the loaded module's."""
    for key in ('n_inputs', 'n_params', 'n_outputs'):
        if info[key] != getattr(module, key):
            raise ExportError(f"{folder}: nn.json says {key} {info[key]!r}, the module has "
                              f"{getattr(module, key)}")
    if 'features' in info and list(info['features']) != list(module.features):
        raise ExportError(f"{folder}: nn.json's features are not the module's "
                          f"({len(info['features'])} listed, the module has {len(module.features)})")
    for key, n in (('input_labels', module.n_inputs), ('param_labels', module.n_params)):
        labels = info[key]
        if not isinstance(labels, list) or len(labels) != n or not all(isinstance(x, str) for x in labels):
            got = f"{len(labels)} of them" if isinstance(labels, list) else type(labels).__name__
            raise ExportError(f"{folder}: nn.json's {key} must be {n} strings, one per "
                              f"{key.split('_')[0]}, got {got}")
