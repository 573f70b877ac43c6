"""Running the C compiler once: the command line (a module, an object file,
or a link), the compiler in its own process group, and what its failure
means, in words that say whose fault it is and what to do.
"""
import os
import re
import subprocess
import sysconfig
import tempfile

from compiler.build.cache import disk_is_full
from compiler.build.errors import (HEADERS_HINT, INSTALL_HINT, FREE_SPACE_HINT, CacheError, CompileError,
                                   CompilerNotFound, CompileTimeout, HeadersNotFound)
from compiler.build.process import run_in_own_group, terminate_cleanly
from compiler.build.toolchain import check_headers, python_include
from compiler.build.verify import elf_problem, load_problem
from compiler.files import remove_if_present

OUT_OF_SPACE = ('No space left on device', 'Disk quota exceeded')


def _out_of_space_problem(toolchain, folder, problem='', **details):
    """``toolchain`` ran out of space in ``folder`` (or in its own temporary folder)."""
    reason = (f"{toolchain.name} ran out of disk space writing into {folder} (or its temporary "
              f"files in {tempfile.gettempdir()}){problem}")
    return CacheError(f"{reason}: {FREE_SPACE_HINT} (and TMPDIR for temporary files)", reason,
                      **details)


def _points_into(stderr, source_path):
    """An error message of the compiler names a line of ``source_path``."""
    name = re.escape(os.path.basename(source_path))
    return re.search(rf'^(?!In file included from).*{name}:\d+(:\d+)?:\s*(fatal )?error', stderr,
                     re.MULTILINE) is not None


def run_compiler(request, toolchain, flags, source_path, out_path, *, objects=None, expected_hash=None):
    """Compile ``source_path`` into the shared object ``out_path`` and check
    the result (``verify``); the command line. ``request`` (a
    ``BuildRequest``) gives the timeout, the headers' folder and whether the
    flags are the defaults (then a failure may point at the generated C
    rather than at the caller's flags); ``toolchain`` and ``flags`` are this
    unit's. ``expected_hash``: the ``program_hash`` to check. With
    ``objects``, link those instead (the translation units of
    ``source_path``), or, with ``objects=()``, compile ``source_path`` into
    the object file ``out_path`` only."""
    timeout, default = request.timeout, request.default
    include = os.path.abspath(python_include(request.include_dir))
    check_headers(include, source_path)
    folder, cwd = os.path.dirname(source_path), None
    src, out, objs = source_path, out_path, list(objects or ())
    if toolchain.family == 'tcc' and any(c in folder for c in '"\\\n'):
        # tcc writes the source's path into a `#define` of its own without
        # escaping it: give it the file's name, and run it in the folder
        cwd, src, out = folder, os.path.basename(source_path), os.path.basename(out_path)
        objs = [os.path.relpath(o, folder) for o in objs]
    # -DNN_PYTHON beside Python's headers: nn.c is plain C unless asked for its CPython module
    if objects is None:
        cmd = [toolchain.path, *toolchain.args, *flags, '-DNN_PYTHON', '-I', include, '-o', out, src, '-lm',
               '-lpthread']
    elif objs:
        cmd = [toolchain.path, *toolchain.args, *flags, '-o', out, *objs, '-lm', '-lpthread']
    else:
        cmd = [toolchain.path, *toolchain.args, *[f for f in flags if f != '-shared'], '-c', '-DNN_PYTHON',
               '-I', include, '-o', out, src]
    with terminate_cleanly():
        try:
            r = run_in_own_group(cmd, timeout=timeout, cwd=cwd)
            problem = None
            if r.returncode == 0 and os.path.exists(out_path) and objects == ():
                problem = elf_problem(out_path, kind=1)        # an object file: whole?
            elif r.returncode == 0 and os.path.exists(out_path):
                problem = elf_problem(out_path)
                if problem is None and include == os.path.abspath(sysconfig.get_paths()['include']):
                    problem = load_problem(out_path, expected_hash)
        except subprocess.TimeoutExpired as e:
            remove_if_present(out_path)
            raise CompileTimeout(f"{toolchain.name} did not finish within {timeout:g} s "
                                 "(try tcc, a lower optimisation level, or a larger timeout: "
                                 "argument timeout=, or $MICROGRAD_CC_TIMEOUT)",
                                 cmd=cmd, stderr=e.stderr or '', source_path=source_path,
                                 cwd=cwd) from None
        except OSError as e:
            remove_if_present(out_path)
            raise CompilerNotFound(f"{toolchain.name} could not be run ({e}); {INSTALL_HINT}",
                                   cmd=cmd, source_path=source_path, cwd=cwd) from None
        except BaseException:
            remove_if_present(out_path)   # Ctrl-C, SIGTERM: the compiler is already dead
            raise
    stderr = r.stderr
    given = []                            # flags that came from the caller, not from us
    if toolchain.args:
        given.append(f"{' '.join(toolchain.args)} from the compiler command")
    if not default:
        given.append(f"flags={flags!r}, which replace the default flags entirely")
    details = dict(cmd=cmd, returncode=r.returncode, stderr=stderr or r.stdout,
                   source_path=source_path, cwd=cwd)
    if r.returncode != 0 or not os.path.exists(out_path):
        remove_if_present(out_path)
        if 'Python.h' in stderr and ('No such file' in stderr or 'not found' in stderr):
            raise HeadersNotFound(f"{toolchain.name} could not find the Python headers in {include}: "
                                  f"{HEADERS_HINT}", **details)
        if any(words in stderr for words in OUT_OF_SPACE):
            raise _out_of_space_problem(toolchain, folder, **details)
        if r.returncode == 0:
            why = (f" (it exited 0 but wrote no shared object: is {toolchain.path} a working C "
                   "compiler?)")
        elif given:
            why = (f" with the flags you gave ({'; '.join(given)}): check them, or leave them out "
                   "to use the defaults")
        elif _points_into(stderr, source_path):
            why = (". If the compiler works otherwise, the generated C is at fault: "
                   "please report it with the kept source")
        else:
            why = ": its own words are below"
        raise CompileError(f"{toolchain.name} failed to compile the generated module{why}", **details)
    if problem:
        remove_if_present(out_path)
        if disk_is_full(folder):
            raise _out_of_space_problem(toolchain, folder, f'; the shared object it wrote, exit '
                                        f'status 0, cannot be used: {problem}', **details)
        blame = ''
        if not given and 'undefined symbol' in problem:
            blame = (". If the compiler works otherwise, the generated C is at fault: please report "
                     "it with the kept source")
        raise CompileError(f"{toolchain.name} exited 0, but the shared object it wrote cannot be "
                           f"used: {problem}{blame}", **details)
    return cmd
