"""One registry type for every name -> implementation table of the library.

Scores, rewards, prompt templates, built-in tasks, evaluation benchmarks and generation
backends are each a ``Registry``: items are added once under a unique name, looked up with an
error that lists the valid names, and listed sorted (or iterated in the order they were added).
Pure Python, so ``gmts.core`` can use it without importing anything beyond torch.

A kind whose items carry their own name exports the registry's methods as its public functions,
one line each (``register_task = _TASKS.register``, ``get_task = _TASKS.get``); built as
``Registry[Task]("task")`` it knows its item type, which documentation reads (:attr:`item_type`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["Registry"]


class Registry(Generic[T]):
    """Named items of one kind.

    Args:
        kind: what an item is, for messages ("score", "reward", "prompt template", ...).
        reserved: names that can never be registered (e.g. the score "none").
    """

    def __init__(self, kind: str, reserved: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._reserved = frozenset(reserved)
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        """Register ``item`` as ``name`` and return it; an empty, taken or reserved name raises."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        if name in self._items or name in self._reserved:
            raise ValueError(f"{self.kind} {name!r} is already registered (or reserved)")
        self._items[name] = item
        return item

    def register(self, item: T) -> T:
        """Register ``item`` under its own ``.name`` and return it (the kinds whose items carry
        their name: objectives, tasks, benchmarks, ...); a taken name raises ValueError."""
        name = getattr(item, "name", None)
        if name is None:
            raise TypeError(f"a {self.kind} registered by itself needs a .name; got {item!r}")
        return self.add(name, item)

    def decorator(self, name: str) -> Callable[[T], T]:
        """``@registry.decorator(name)`` registers the decorated object as ``name``."""
        return lambda item: self.add(name, item)

    def get(self, name: str) -> T:
        """The item registered as ``name``; an unknown name raises ValueError listing valid ones."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ValueError(
                f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self.names())}"
            ) from None

    @property
    def item_type(self) -> object:
        """The ``T`` of a registry built as ``Registry[T](kind)`` (None when built untyped)."""
        args = getattr(getattr(self, "__orig_class__", None), "__args__", None)
        return args[0] if args else None

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        """Names in the order they were registered."""
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)

    def remove(self, name: str) -> T:
        """Unregister ``name`` (for tests and plugins that replace an item); returns the item."""
        self.get(name)
        return self._items.pop(name)
