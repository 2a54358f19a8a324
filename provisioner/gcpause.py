"""Pause Python's cyclic garbage collector while a large spec is built or rendered.

Expanding a 16,384-node spec allocates hundreds of thousands of small objects (ports, cables, diagnostics paths)
and none of them form reference cycles that need collecting; the collector would still walk every live object
each time its thresholds trip, about a quarter of the time spent. Reference counting frees everything as usual;
the collector runs again as soon as the call returns.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def without_gc(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` with the cyclic collector paused during the call (left as it was found: nested calls are fine)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return wrapper
