"""What to build (``BuildRequest``) and what was built (``Build``).

A request passes unchanged through the layers of a build: the cache, the
translation units, the compiler runs. It is made by ``choice.plan`` (the
size-aware choice, for ``compiler.compile``) or by ``BuildRequest.of``
(a compiler and flags given).
"""
from dataclasses import dataclass, field

from compiler.build.cache import build_key
from compiler.build.flags import DEFAULT_TIMEOUT, are_default_flags, check_flags, check_timeout
from compiler.build.toolchain import Toolchain

# A build expected to take longer than this (seconds) tells ``progress``.
ANNOUNCE_AFTER = 2.0
# The name of the loop kernels' translation unit (compiler.codegen.kernels_unit).
KERNELS_UNIT = 'kernels'


@dataclass(frozen=True)
class BuildRequest:
    """``source`` (str, or ``compiler.codegen.Source`` with translation units
    ``parts``, of which ``straight`` hold straight-line code) built by
    ``toolchain`` with ``flags``; the straight-line parts by
    ``straight_toolchain`` (None: ``toolchain``) with ``straight_flags``
    (None: ``flags``). ``timeout``: seconds, None for no limit.
    ``include_dir``: the folder of ``Python.h`` (None: the default).
    ``default``: the flags are the defaults (a failure then blames the
    generated C, not the caller's flags). ``progress(message)`` hears about a
    build expected (``estimate``, seconds) to take more than a couple of
    seconds. ``kernel_flags``: the loop kernels' unit's flags (None:
    ``flags``), the same fixed text for every program, optimised fully
    whatever level the program's size chose for the rest."""
    source: str = field(repr=False)
    toolchain: Toolchain
    flags: tuple
    straight_toolchain: Toolchain = None
    straight_flags: tuple = None
    timeout: float = None
    include_dir: str = None
    default: bool = True
    progress: object = field(default=None, compare=False)
    estimate: float = 0.0
    table_ops: int = 0          # the source's scalar ops that run from an op table (0: statements)
    kernel_flags: tuple = None

    @classmethod
    def of(cls, source, toolchain, flags, *, timeout=DEFAULT_TIMEOUT, include_dir=None, progress=None,
           straight_flags=None, straight_toolchain=None, estimate=0.0, default=None, table_ops=0,
           kernel_flags=None):
        """A request with its arguments checked: ``flags`` a list of str
        (``TypeError`` for one string), ``timeout`` in seconds (``inf``: none);
        ``default`` (None: whether ``flags`` are ``default_flags``)."""
        flags = tuple(check_flags(flags))
        if straight_flags is not None:
            straight_flags = tuple(check_flags(straight_flags))
        if kernel_flags is not None:
            kernel_flags = tuple(check_flags(kernel_flags))
            if kernel_flags == flags:
                kernel_flags = None
        if straight_toolchain == toolchain:
            straight_toolchain = None
        if default is None:
            default = are_default_flags(toolchain, list(flags))
        return cls(source, toolchain, flags, straight_toolchain, straight_flags, check_timeout(timeout),
                   include_dir, default, progress, estimate, table_ops, kernel_flags)

    @property
    def parts(self):
        """The translation units ``[(name, text)]``; none for a source of one unit."""
        parts = getattr(self.source, 'parts', ())
        return parts if len(parts) > 1 else ()

    @property
    def split(self):
        """The straight-line parts are built otherwise than the rest."""
        return bool(self.straight_flags) and bool(self.parts)

    @property
    def own_kernel_flags(self):
        """The loop kernels' unit is built with flags of its own."""
        return self.kernel_flags is not None and any(name == KERNELS_UNIT for name, _ in self.parts)

    def unit(self, name):
        """(toolchain, flags) for the translation unit ``name``."""
        if self.split and name in getattr(self.source, 'straight', ()):
            return self.straight_toolchain or self.toolchain, list(self.straight_flags)
        if name == KERNELS_UNIT and self.kernel_flags is not None:
            return self.toolchain, list(self.kernel_flags)
        return self.toolchain, list(self.flags)

    def key(self):
        """The cache key of the shared object."""
        marks = []
        if self.split:
            tc = self.straight_toolchain or self.toolchain
            marks = ['--straight', tc.path, tc.version, *self.straight_flags]
        if self.own_kernel_flags:
            marks += ['--kernels', *self.kernel_flags]
        # the kernels' unit carries the sets of this machine (compiler.cpu), not
        # those of the one file `source`: a module built elsewhere is not this one
        marks += [f'--{name}={self.unit_key(name, text)}' for name, text in self.parts if name == KERNELS_UNIT]
        return build_key(self.source, self.toolchain, [*self.flags, *marks], self.include_dir)

    def unit_key(self, name, text):
        """The cache key of the translation unit ``name``'s object file."""
        tc, flags = self.unit(name)
        return build_key(text, tc, ['-c', *flags], self.include_dir)

    def link_flags(self):
        """The flags that link the objects: tcc's objects do not say that their
        stack need not be executable, so the linker must be told."""
        tc = self.straight_toolchain
        if self.split and tc is not None and tc.family == 'tcc':
            return [*self.flags, '-Wl,-z,noexecstack']
        return list(self.flags)

    def built(self, path, cmd, *, cached, temporary, sha256=None):
        """The ``Build`` of this request at ``path``."""
        return Build(path, cmd, cached, temporary, self.toolchain, list(self.flags),
                     list(self.straight_flags) if self.split else None,
                     self.straight_toolchain if self.split else None, sha256, self.table_ops,
                     list(self.kernel_flags) if self.own_kernel_flags else None)


@dataclass
class Build:
    path: str          # the shared object to load (None: it was in a temporary folder, removed once loaded)
    cmd: list          # the command that built it (None when it came from the cache)
    cached: bool
    temporary: bool    # the caller removes ``path`` once it is loaded
    toolchain: Toolchain
    flags: list
    straight_flags: list = None     # the straight-line parts' flags, when not ``flags``
    straight_toolchain: Toolchain = None    # and their compiler, when not ``toolchain``
    sha256: str = None              # the checksum the shared object had when it was checked
    table_ops: int = 0              # scalar ops run from an op table (0: as statements)
    kernel_flags: list = None       # the loop kernels' unit's flags, when not ``flags``

    def flags_text(self):
        """The flags, and the straight-line parts' level (or compiler) and
        the loop kernels' level where they differ."""
        text = ' '.join(self.flags)
        if self.straight_toolchain is not None:
            text += f' (straight-line parts {self.straight_toolchain.family})'
        elif self.straight_flags:
            text += f' (straight-line parts {self.straight_flags[0]})'
        return text + (f' (loop kernels {self.kernel_flags[0]})' if self.kernel_flags else '')

    def scalar_code(self):
        """How the scalar ops were built: as straight-line statements, or as an op table."""
        if self.table_ops:
            return f'an op table of {self.table_ops:,} scalar ops, one C loop each way'
        return 'straight-line statements'
