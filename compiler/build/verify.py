"""Checking a shared object (or an object file) before it is used or
recorded: a non-empty ELF file for this machine (class, byte order, machine)
whose segments all lie within the file, and (built against this
interpreter's headers) one that loads in a child Python -- so a damaged one
can crash only the child -- and reports the ``program_hash`` its source
declares.
"""
import functools
import os
import re
import signal
import struct
import subprocess
import sys

from compiler.build.process import run_in_own_group

# the prologue of nn.c (compiler/codegen/module.py): #define NN_PROGRAM_HASH "<16 hex digits>"
PROGRAM_HASH = re.compile(r'#define NN_PROGRAM_HASH "([0-9a-f]+)"')
LOAD_CHECK = '''\
import importlib.machinery, importlib.util, sys
loader = importlib.machinery.ExtensionFileLoader('nn', sys.argv[1])
spec = importlib.util.spec_from_file_location('nn', sys.argv[1], loader=loader)
module = importlib.util.module_from_spec(spec)
loader.exec_module(module)
print('program_hash=%s' % getattr(module, 'program_hash', None))
'''
LOAD_CHECK_TIMEOUT = 120


def program_hash(source):
    """The ``program_hash`` the generated module ``source`` declares, or ``None``."""
    m = PROGRAM_HASH.search(source)
    return m.group(1) if m else None


@functools.lru_cache(maxsize=None)
def _this_machine():
    """(class, byte order, machine) of this interpreter's ELF binary, or
    ``None`` where binaries are not ELF (the ELF checks are then skipped)."""
    for path in ('/proc/self/exe', sys.executable):
        try:
            with open(path, 'rb') as f:
                head = f.read(20)
        except OSError:
            continue
        if head[:4] == b'\x7fELF':
            endian = '<' if head[5] == 1 else '>'
            return head[4], head[5], struct.unpack_from(endian + 'H', head, 18)[0]
    return None


def elf_problem(path, kind=3):
    """What is wrong with the shared object (``kind`` 3; 1: an object file)
    at ``path`` that can be seen without loading it (empty, not ELF, another
    machine's, truncated), or ``None``."""
    try:
        size = os.path.getsize(path)
        with open(path, 'rb') as f:
            head = f.read(64)
            machine = _this_machine()
            if size == 0:
                return 'it is empty'
            if machine is None:
                return None
            if head[:4] != b'\x7fELF':
                return 'it is not an ELF file'
            if len(head) < 20:
                return f'it is truncated: {size} bytes, too short for an ELF header'
            if (head[4], head[5]) != machine[:2]:
                return (f'it is an ELF file of another class or byte order ({head[4]}, {head[5]}; '
                        f'this Python is {machine[0]}, {machine[1]})')
            if len(head) < (64 if head[4] == 2 else 52):
                return f'it is truncated: {size} bytes, too short for an ELF header'
            e = '<' if head[5] == 1 else '>'
            wide = head[4] == 2
            e_type, e_machine = struct.unpack_from(e + 'HH', head, 16)
            if e_machine != machine[2]:
                return f'it is for another machine (ELF machine {e_machine}, this Python is {machine[2]})'
            if e_type != kind:
                return f'it is not {"a shared object" if kind == 3 else "an object file"} (ELF type {e_type})'
            if wide:
                phoff, shoff = struct.unpack_from(e + 'QQ', head, 32)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(e + 'HHHH', head, 54)
            else:
                phoff, shoff = struct.unpack_from(e + 'II', head, 28)
                phentsize, phnum, shentsize, shnum = struct.unpack_from(e + 'HHHH', head, 42)
            end = max(phoff + phnum * phentsize, shoff + shnum * shentsize)
            if end > size:
                return f'it is truncated: {size} bytes, but its header tables reach byte {end}'
            f.seek(phoff)
            table = f.read(phnum * phentsize)
            for i in range(phnum):
                if wide:
                    p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(e + 'IIQQQQ', table,
                                                                             i * phentsize)
                else:
                    p_type, p_offset, _, _, p_filesz = struct.unpack_from(e + 'IIIII', table, i * phentsize)
                if p_type == 1 and p_offset + p_filesz > size:      # PT_LOAD
                    return (f'it is truncated: {size} bytes, but a segment it loads ends at byte '
                            f'{p_offset + p_filesz}')
    except (OSError, struct.error) as err:
        return f'it cannot be read ({err})'
    return None


def load_problem(path, expected_hash):
    """Load ``path`` in a child Python (a crash stays there): what went wrong, or ``None``."""
    try:
        r = run_in_own_group([sys.executable, '-I', '-S', '-c', LOAD_CHECK, path],
                             timeout=LOAD_CHECK_TIMEOUT, with_children=False)
    except subprocess.TimeoutExpired:
        return f'loading it in a test process did not finish within {LOAD_CHECK_TIMEOUT} s'
    except OSError:
        return None            # no child process can be started: the ELF checks must do
    if r.returncode < 0:
        try:
            name = signal.Signals(-r.returncode).name
        except ValueError:
            name = f'signal {-r.returncode}'
        return f'loading it crashed a test process ({name})'
    if r.returncode:
        last = (r.stderr.strip().splitlines() or ['no message'])[-1]
        return f'it does not load: {last}'
    got = r.stdout.strip().rpartition('program_hash=')[2]
    if expected_hash and got != expected_hash:
        return (f'it reports program_hash {got}, but the source declares {expected_hash}: '
                'it is the build of another program')
    return None
