"""What can go wrong in a build: ``BuildError`` and its kinds. Each says what
failed, how (the command, its exit status and first lines of stderr), and
where the C source was kept."""

INSTALL_HINT = "install one, e.g. 'apt-get install clang tcc' or 'apt-get install gcc'"
HEADERS_HINT = "install the Python development headers (e.g. 'apt-get install python3-dev')"
FREE_SPACE_HINT = ("free some space ('python -m compiler cache --clear' empties the build cache), "
                   "or set MICROGRAD_CACHE_DIR to a folder on another disk")


class BuildError(RuntimeError):
    """A build failed; ``cmd``, ``returncode``, ``stderr`` and ``source_path`` say how."""

    def __init__(self, message, cmd=None, returncode=None, stderr='', source_path=None, cwd=None):
        self.cmd, self.returncode, self.stderr, self.source_path = cmd, returncode, stderr, source_path
        details = []
        if cmd:
            details.append('command: ' + ' '.join(cmd))
        if cwd:
            details.append(f'run in: {cwd}')
        if returncode is not None:
            details.append(f'exit status: {returncode}')
        if stderr:
            details.append('stderr (first lines):\n  ' + '\n  '.join(stderr.splitlines()[:20]))
        if source_path:
            details.append(f'C source kept at: {source_path}')
        super().__init__('\n'.join([message] + details))


class CompilerNotFound(BuildError):
    pass


class HeadersNotFound(BuildError):
    pass


class CompileError(BuildError):
    pass


class CompileTimeout(BuildError):
    pass


class CacheError(BuildError):
    """The build folder (the cache, or a temporary folder) cannot be used:
    not a folder, read-only, unwritable, someone else's, or a full disk.
    ``reason`` says what is wrong, without what to do."""

    def __init__(self, message, reason=None, **details):
        self.reason = reason or message
        super().__init__(message, **details)
