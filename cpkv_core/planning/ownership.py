"""Page ownership under sharded KV: pure arithmetic, no table to keep coherent.

A logical page is stored by exactly one CP rank, its owner: ``page % cp_size``. On its owner
the page lives at local physical page ``page // cp_size``, so a rank's physical pool is
``1/cp_size`` of the logical address space.
"""

from __future__ import annotations


def owner_of_page(page: int, cp_size: int) -> int:
    """The rank that stores logical ``page``."""
    return page % cp_size


def local_page(page: int, cp_size: int) -> int:
    """Physical page index of logical ``page`` in its owner's pool."""
    return page // cp_size


def owner_of_loc(loc: int, page_size: int, cp_size: int) -> int:
    """The rank that stores logical ``loc``."""
    return (loc // page_size) % cp_size


def physical_loc(loc: int, page_size: int, cp_size: int) -> int:
    """Row of logical ``loc`` in its owner's physical pool."""
    return local_page(loc // page_size, cp_size) * page_size + loc % page_size
