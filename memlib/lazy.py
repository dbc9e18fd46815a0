"""``cached_property`` without the class-wide lock of Python 3.11's.

``functools.cached_property`` (3.8-3.11) computes under one lock per property shared by every
instance of the class: while one tenant's token matrix made its int8 copy, every other tenant's
first query waited for it, and concurrent cold requests were served one at a time. This one
(the 3.12 behaviour) stores the value in the instance's ``__dict__`` with no lock; two threads
that miss at once both compute it, and the callers here guard the costly ones with their own
per-instance single flight (:meth:`memlib.retrieve.tenant.TenantIndex.memo`).
"""
from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class cached_property(Generic[T]):  # noqa: N801 - a drop-in for functools.cached_property
    def __init__(self, func: Callable[[Any], T]):
        self.func, self.attrname, self.__doc__ = func, func.__name__, func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.attrname = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = self.func(obj)
        obj.__dict__[self.attrname] = value  # a non-data descriptor: later reads find the value first
        return value
