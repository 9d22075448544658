"""The whole local stack wired together: ``from sandbox.stack import Stack, StackConfig``.

The two names are resolved lazily so that a small module of the stack (``sandbox.stack.timeline``,
which tests build on their own) can be imported without pulling the whole stack in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.stack.config import StackConfig
    from sandbox.stack.core import Stack

__all__ = ["Stack", "StackConfig"]


def __getattr__(name: str) -> Any:
    if name == "Stack":
        from sandbox.stack.core import Stack

        return Stack
    if name == "StackConfig":
        from sandbox.stack.config import StackConfig

        return StackConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
