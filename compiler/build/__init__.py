"""Build C source into a CPython extension, with an on-disk cache.

One stage per module, in the order a build meets them:

- ``errors``: ``BuildError`` and its kinds;
- ``toolchain``: which C compiler (``find_compiler``, ``Toolchain``), the
  Python headers, what ``-march=native`` means here;
- ``flags``: optimisation levels, default flags (IEEE semantics: no
  fast-math, no FMA contraction), checks of flags, levels and timeouts;
- ``choice``: the size-aware choice of compiler and levels
  (``choose_build``) and ``plan``, which turns ``compiler.compile``'s
  arguments into a ``BuildRequest`` (``request``: what to build; ``Build``:
  what was built);
- ``cache``: the cache folder, keys, entries, locks, eviction, trust;
- ``run``: running the compiler once and explaining its failures;
- ``verify``: the ELF check and the load check in a child process;
- ``process``: running a program in a process group that ends with this
  process, killing it, the cores this process may use;
- ``extension``: ``build_extension``, tying them together.

    request = plan(source, cc='clang', opt='-O1')
    build = build_extension(request)          # a Build: build.path, build.cmd...
"""
from compiler.build.cache import (build_key, cache_chosen, cache_dir, cache_disabled, cache_max, cache_root,
                                  discard_entry)
from compiler.build.choice import (COMPILE_BUDGET, COMPILE_SECONDS, DEFAULT_BUILDS, Choice, build_estimate,
                                   choose_build, compile_estimate, plan)
from compiler.build.errors import (BuildError, CacheError, CompileError, CompilerNotFound, CompileTimeout,
                                   HeadersNotFound)
from compiler.build.extension import build_extension, build_unit_ahead
from compiler.build.flags import (DEFAULT_OPT, DEFAULT_TIMEOUT, OPT_LEVELS, check_flags, check_opt,
                                  check_timeout, default_flags)
from compiler.build.request import Build, BuildRequest
from compiler.build.toolchain import Toolchain, find_compiler, python_include
from compiler.build.verify import elf_problem, program_hash

__all__ = ['BuildError', 'CacheError', 'CompileError', 'CompilerNotFound', 'CompileTimeout', 'HeadersNotFound',
           'Build', 'BuildRequest', 'Choice', 'Toolchain', 'build_extension', 'build_unit_ahead', 'plan', 'choose_build',
           'find_compiler', 'default_flags', 'check_flags', 'check_opt', 'check_timeout', 'program_hash',
           'elf_problem', 'discard_entry', 'build_key', 'cache_dir', 'cache_root', 'cache_max', 'cache_chosen',
           'cache_disabled', 'python_include', 'compile_estimate', 'build_estimate', 'DEFAULT_TIMEOUT',
           'DEFAULT_OPT', 'OPT_LEVELS', 'COMPILE_BUDGET', 'COMPILE_SECONDS', 'DEFAULT_BUILDS']
