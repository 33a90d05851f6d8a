"""The live objects of one class, found through the garbage collector without breaking the process's other threads.

Why the care: ``gc.get_objects()`` returns a list holding a reference to every tracked object, including a tuple
that another thread is still building. CPython builds ``tuple(<generator>)`` by resizing the tuple in place, which
it refuses while anything else holds a reference (``SystemError: Objects/tupleobject.c:927: bad argument to
internal function``, CPython bpo-15108): a data loader's thread (Paddle's reader, under ``ampsafe run``) died that
way while the scan's list was alive and the interpreter switched threads during the scan. Here the filter runs in
C (no Python frame, so no thread switch between objects), the list is dropped before Python code runs again, and
the interpreter's switch interval is held long for the scan, after one yield that lets any thread already waiting
for the GIL under the old interval through first.
"""

from __future__ import annotations

import gc
import sys
import time
from itertools import compress

__all__ = ["live_objects"]

# the switch interval during a scan: a scan takes about 0.2 us an object (0.05 s for torch, transformers and paddle
# imported), so a few million objects fit; a thread running pure Python may keep the GIL this long once, before it
HOLD_S = 1.0


def live_objects(kind: type) -> list:
    """Every object the garbage collector tracks whose class is ``kind`` or a subclass of it (by ``type()``, so no
    ``__class__`` property or proxy is consulted)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(max(interval, HOLD_S))
    try:
        time.sleep(interval)  # a thread waiting under the old interval takes its turn now, not mid-scan
        return _scan(kind)
    finally:
        sys.setswitchinterval(interval)


def _scan(kind: type) -> list:
    everything = gc.get_objects()
    try:
        return list(compress(everything, map(kind.__subclasscheck__, map(type, everything))))
    finally:
        del everything
