"""Large numeric tables of the generated C as hex string literals.

A table of a million ints written as C initializers costs Python seconds to
format and the C compiler seconds (and hundreds of megabytes: one syntax
node each) to read; the same bytes as one hex string literal cost
``bytes.hex`` milliseconds and the compiler a lexer pass. The module unpacks
each blob once, at the first state's ``init_constants``, into a static array
(little-endian, as numpy wrote it; doubles bit for bit).
"""
import numpy as np

# Hex digits per line of a blob's literal.
LINE = 1024
# Values from which a table of constants is a blob (fewer: readable initializers).
MIN_VALUES = 4096

UNPACK_C = r'''
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the blobs of the op table and the constants are little-endian (compiler/codegen/blob.py)"
#endif

/* a blob (compiler/codegen/blob.py): little-endian bytes as hex digits */
static void
unpack_hex(const char *hex, unsigned char *to, size_t bytes)
{
#define HEX_DIGIT(c) ((c) <= '9' ? (c) - '0' : (c) - 'a' + 10)
    for (size_t i = 0; i < bytes; i++)
        to[i] = (unsigned char)(HEX_DIGIT(hex[2 * i]) << 4 | HEX_DIGIT(hex[2 * i + 1]));
#undef HEX_DIGIT
}
'''


def little_endian(values, ctype):
    """The bytes of ``values`` as C's ``ctype`` (``'int'``: int32, ``'double'``) in little-endian order."""
    return np.ascontiguousarray(values, dtype={'int': '<i4', 'double': '<f8'}[ctype]).tobytes()


def literal(name, data):
    """``static const char name[] = "..."``: the bytes ``data`` as hex digits."""
    lines = data.hex('\0', -(LINE // 2)).replace('\0', '"\n"')     # LINE digits a line, from the first
    return f'static const char {name}[] =\n"' + lines + '";'


def unpack_statement(name, target, ctype, n):
    """The C statement filling ``target`` (``n`` values of ``ctype``) from the blob ``name``."""
    return f'unpack_hex({name}, (unsigned char *){target}, {n} * sizeof({ctype}));'
