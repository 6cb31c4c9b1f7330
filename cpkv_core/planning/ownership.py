"""Page ownership under sharded KV: pure arithmetic, no table to keep coherent.

A logical page is stored by exactly one CP rank, its owner: ``page % cp_size``. On its owner
the page lives at local physical page ``page // cp_size``, so a rank's physical pool is
``1/cp_size`` of the logical address space. Every owner and physical-page formula of the
project goes through here; each function takes a host int or an int64 array of them.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

__all__ = ["local_page", "owner_of_loc", "owner_of_page", "physical_loc"]

Ids = TypeVar("Ids", int, npt.NDArray[np.int64])
"""Logical page or loc ids: one int, or an int64 array of them (elementwise)."""


def owner_of_page(page: Ids, cp_size: int) -> Ids:
    """The rank that stores logical ``page``."""
    return page % cp_size


def local_page(page: Ids, cp_size: int) -> Ids:
    """Physical page index of logical ``page`` in its owner's pool."""
    return page // cp_size


def owner_of_loc(loc: Ids, page_size: int, cp_size: int) -> Ids:
    """The rank that stores logical ``loc``."""
    return owner_of_page(loc // page_size, cp_size)


def physical_loc(loc: Ids, page_size: int, cp_size: int) -> Ids:
    """Row of logical ``loc`` in its owner's physical pool."""
    return local_page(loc // page_size, cp_size) * page_size + loc % page_size
