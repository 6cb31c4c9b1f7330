"""cpkv's CPU stand-in for torchvision 0.28 (see ``scripts/sglang_standins/pyproject.toml``).

It holds only the names SGLang 0.5.23 and transformers 5.19 import at module level; every
function raises :class:`StandInCalled`. The stand-ins are listed in
``cpkv_sglang/cpu/standins.py``.
"""

from collections.abc import Callable
from typing import NoReturn

__version__ = "0.28.0+cpkv.standin"


class StandInCalled(RuntimeError):
    """Code of the torchvision stand-in ran: the tested path was meant never to reach it."""


def standin(qualname: str) -> Callable[..., NoReturn]:
    """A function named ``qualname`` that raises :class:`StandInCalled` when called."""

    def call(*args: object, **kwargs: object) -> NoReturn:
        raise StandInCalled(
            f"{qualname} was called, but torchvision here is cpkv's CPU stand-in "
            "(scripts/sglang_standins): install a real torchvision to run it"
        )

    call.__qualname__ = call.__name__ = qualname.rsplit(".", 1)[-1]
    return call
