"""``ampsafe.core.live_objects``: the garbage-collector scan that finds a run's model and optimizer must not kill
another thread that is building a tuple from a generator (a data loader's reader thread), which a plain
``[o for o in gc.get_objects() if ...]`` does on CPython (``SystemError: ... tupleobject.c ... bad argument to
internal function``)."""

from __future__ import annotations

import gc
import sys
import threading
import time

import pytest

from ampsafe.core.live_objects import live_objects


class _Kind:
    pass


class _Sub(_Kind):
    pass


def _race(scan, seconds: float) -> tuple[list, int]:
    """Scan repeatedly for ``seconds`` while another thread builds tuples from generators, switching threads as
    often as the interpreter allows: (the errors that thread met, the number of scans)."""
    errors: list = []
    stop = threading.Event()

    def builder():
        while not stop.is_set():
            try:
                tuple(float(v) for v in range(50))
            except SystemError as error:
                errors.append(error)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=builder, daemon=True)
    thread.start()
    scans = 0
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not errors:
            scan()
            scans += 1
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    return errors, scans


def test_a_scan_leaves_a_thread_building_a_tuple_alive():
    def plain():
        return [o for o in gc.get_objects() if issubclass(type(o), dict)]

    errors, _ = _race(plain, 5.0)
    if not errors:
        pytest.skip("this interpreter's plain gc.get_objects() scan did not break the tuple-building thread in 5 s")
    errors, scans = _race(lambda: live_objects(dict), 3.0)
    assert not errors and scans >= 2, (errors, scans)


def test_it_finds_exactly_the_live_instances_of_a_class_and_its_subclasses():
    kept = [_Kind(), _Sub(), object()]
    found = live_objects(_Kind)
    assert {id(o) for o in found} == {id(kept[0]), id(kept[1])}
    assert sys.getswitchinterval() < 1.0  # the interpreter's switch interval is given back
