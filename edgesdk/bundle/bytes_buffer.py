"""A new ``bytes`` object filled in place, so a decrypted model is not copied once more.

The runtimes take a model as immutable ``bytes`` (LiteRT even keeps a reference to it).
Decrypting into a ``bytearray`` and then calling ``bytes(...)`` writes every byte twice into
freshly faulted memory: for a 100 MB model, 100 MB more at the peak and ~50 ms here.

CPython's own C code makes ``bytes`` by allocating uninitialised storage
(``PyBytes_FromStringAndSize(NULL, n)``) and filling it before anyone else sees the object.
:class:`BytesBuilder` does the same through ``ctypes``; the object is handed out only
when it is completely written (and the caller checks its SHA-256). Where that is not
possible (not CPython, or the start-up self-test fails) it falls back to a ``bytearray``
and one copy: slower, same result.
"""

from __future__ import annotations

import ctypes
import sys
from functools import cache

#: offsetof(PyBytesObject, ob_sval): CPython sizes bytes as that offset + 1 (the NUL).
_DATA_OFFSET = bytes.__basicsize__ - 1


def _new_uninitialised(size: int) -> tuple[bytes, memoryview]:
    from_size = ctypes.pythonapi.PyBytes_FromStringAndSize
    from_size.restype = ctypes.py_object
    from_size.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
    obj: bytes = from_size(None, size)
    storage = (ctypes.c_char * size).from_address(id(obj) + _DATA_OFFSET)
    return obj, memoryview(storage).cast("B")


@cache
def in_place_supported() -> bool:
    """Whether bytes can be filled in place here (CPython, and a self-test passes)."""
    if sys.implementation.name != "cpython":
        return False
    try:
        pattern = bytes(range(97, 97 + 26))
        obj, view = _new_uninitialised(len(pattern))
        view[:] = pattern
        view.release()
        return obj == pattern and hash(obj) == hash(pattern)
    except (AttributeError, TypeError, ValueError, OSError):
        return False


class BytesBuilder:
    """``size`` bytes to fill through :attr:`view`, then :meth:`finish` for the ``bytes``."""

    def __init__(self, size: int) -> None:
        self.size = size
        # Sizes 0 and 1 may be interpreter-wide singletons: never write into those.
        self._in_place = size > 1 and in_place_supported()
        self._obj: bytes | None
        self._scratch: bytearray | None
        if self._in_place:
            self._obj, self.view = _new_uninitialised(size)
            self._scratch = None
        else:
            self._obj = None
            self._scratch = bytearray(size)
            self.view = memoryview(self._scratch)

    def finish(self) -> bytes:
        """The filled bytes object. The view is released: nothing can write to it any more."""
        self.view.release()
        if self._obj is not None:
            obj, self._obj = self._obj, None
            return obj
        scratch, self._scratch = self._scratch, None
        return bytes(scratch or b"")
