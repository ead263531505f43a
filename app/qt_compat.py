"""A guard against a reference-counting bug in PySide6 6.12 on CPython < 3.12.

Measured here (PySide6-Essentials 6.12.0, Python 3.11.7): every call of a Qt method that
returns void drops one reference to `None` (`QWidget.update()`, `QPainter.setPen()`, …),
and every `Signal.emit()` drops one reference to `True`/`False`. After a few thousand calls
the count reaches zero and CPython aborts ("none_dealloc: deallocating None"). Python 3.12
made these singletons immortal, which hides the bug; on 3.11 we give them a reference count
so large that no session can use it up. Only the registry's newest PySide6 (6.12.0) was
installable here, so pinning an older one was not an option.
"""

from __future__ import annotations

import ctypes
import sys

_HEADROOM = 1 << 48  # ~2.8e14 leaked references; the counter is a 64-bit ssize_t
_done = False


def guard_singleton_refcounts() -> bool:
    """Make None/True/False effectively immortal where needed; True when applied."""
    global _done
    if _done or sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    for obj in (None, True, False):
        # ob_refcnt is the first field of every CPython object header.
        ctypes.c_ssize_t.from_address(id(obj)).value += _HEADROOM
    _done = True
    return True


def affected(pyside_version: str) -> bool:
    return pyside_version.startswith("6.12") and sys.version_info < (3, 12)
