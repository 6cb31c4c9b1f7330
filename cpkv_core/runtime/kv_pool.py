"""Paged KV pools: per layer, MLA latent KV plus the indexer's key and per-token scale."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from cpkv_core.config import IndexKDtype, ModelConfig


@dataclass(frozen=True, slots=True)
class KVRows:
    """KV of a set of tokens, as stored: the unit that is written, read and gathered."""

    latent: Tensor  # [n, kv_dim] fp32
    index_k: Tensor  # [n, index_head_dim] fp8 e4m3 or fp32
    index_k_scale: Tensor  # [n] fp32

    def __len__(self) -> int:
        return int(self.latent.shape[0])

    def select(self, index: Tensor) -> KVRows:
        """The rows at ``index [m]`` (an int64 tensor on the rows' device)."""
        return KVRows(
            self.latent.index_select(0, index),
            self.index_k.index_select(0, index),
            self.index_k_scale.index_select(0, index),
        )

    def select_pages(self, pages: Tensor, page_size: int) -> KVRows:
        """The rows of whole pages ``pages [p]`` (page ``k`` is rows ``k * page_size`` on),
        page by page: ``select`` of ``page_rows(pages, page_size)``, one ``page_size``-row
        copy per page instead of one per row."""
        return KVRows(
            *(
                by_page(t, page_size)
                .index_select(0, pages)
                .view(len(pages) * page_size, *t.shape[1:])
                for t in (self.latent, self.index_k, self.index_k_scale)
            )
        )


def by_page(rows: Tensor, page_size: int) -> Tensor:
    """``rows [n, ...]`` as ``[n // page_size, page_size * ...]``: one entry per whole page
    (a view; the rows after the last whole page are left out)."""
    # NOTE: no slice when the rows are whole pages, and shapes read once: a PD sender calls
    # this hundreds of times a layer (pd.pack), where each tensor op costs microseconds.
    num_rows, *row_shape = rows.shape
    pages = num_rows // page_size
    whole = rows if pages * page_size == num_rows else rows[: pages * page_size]
    return whole.view(pages, page_size * math.prod(row_shape))


def page_rows(pages: Tensor, page_size: int) -> Tensor:
    """``[p * page_size]`` the rows of ``pages [p]``, page by page."""
    within = torch.arange(page_size, dtype=pages.dtype, device=pages.device)
    return (pages[:, None] * page_size + within[None, :]).reshape(-1)


@dataclass(frozen=True, slots=True)
class SavedRows:
    """What some token rows of every layer held before a batch wrote them."""

    rows: Tensor  # [n] pool rows
    layers: tuple[KVRows, ...]
    """Per layer, the rows' values (``[n, ...]``)."""

    @property
    def nbytes(self) -> int:
        """Bytes the save copied: every layer's saved tensors, as stored."""
        return sum(
            t.numel() * t.element_size()
            for layer in self.layers
            for t in (layer.latent, layer.index_k, layer.index_k_scale)
        )


@dataclass(frozen=True, slots=True)
class LatentStorage:
    """How a pool stores one token's MLA latent KV: ``width`` elements of ``dtype``.

    The test vehicle stores ``kv_dim`` fp32 values; the production layouts are ``kv_dim``
    bf16 values or FlashMLA's fp8 layout as ``656`` opaque bytes (``uint8``).
    """

    dtype: torch.dtype
    width: int

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's latent row."""
        return self.dtype.itemsize * self.width


def vehicle_latent(cfg: ModelConfig) -> LatentStorage:
    """The test vehicle's latent: ``kv_dim`` fp32 values."""
    return LatentStorage(torch.float32, cfg.kv_dim)


_COPY_WORDS = (torch.complex128, torch.int64, torch.int32, torch.int16)
"""Words a row copy moves, widest first. ``complex128`` is a pair of 8-byte words: a copy
moves it as it is, with no arithmetic that could touch a NaN's bits."""


def _words(t: Tensor) -> Tensor:
    """``t`` (``[n]`` or ``[n, w]``) with each row as the widest words its bytes split into
    (``_COPY_WORDS``), for a copy; ``t`` itself when no such view exists."""
    row_bytes = t.element_size() * (int(t.shape[1]) if t.dim() == 2 else 1)
    for word in _COPY_WORDS:
        if row_bytes % word.itemsize == 0 and row_bytes >= word.itemsize:
            break
    else:
        word = torch.uint8
    if word.itemsize == t.element_size():
        return t.view(word) if t.is_floating_point() else t
    try:
        return t.view(torch.uint8).view(word) if t.element_size() == 1 else t.view(word)
    except RuntimeError:
        return t


def copy_rows_(dest: Tensor, index: Tensor, rows: Tensor) -> None:
    """``dest.index_copy_(0, index, rows)``, bit for bit, as a copy of wide words.

    ``index_copy_`` moves one element at a time on the CPU, so both sides are viewed as the
    widest words their rows split into (``_COPY_WORDS``): a 1,152-byte bf16 row moves in 72
    16-byte steps instead of 576, a 656-byte fp8 row in 41 instead of 656. Tensors with no
    such view are copied element by element (float8 as its bytes: ``index_copy_`` has no
    float8 kernel).
    """
    dest_words, row_words = _words(dest), _words(rows)
    if dest_words.dtype == row_words.dtype and dest_words.shape[1:] == row_words.shape[1:]:
        dest_words.index_copy_(0, index, row_words)
    elif dest.element_size() == 1:
        dest.view(torch.uint8).index_copy_(0, index, rows.view(torch.uint8))
    else:
        dest.index_copy_(0, index, rows)


def index_k_torch_dtype(dtype: IndexKDtype) -> torch.dtype:
    """The torch dtype that stores index K for ``dtype``."""
    return torch.float8_e4m3fn if dtype is IndexKDtype.FP8_E4M3 else torch.float32


def kv_bytes_per_token(cfg: ModelConfig, dtype: IndexKDtype, latent_itemsize: int = 4) -> int:
    """Bytes one token occupies in one layer's pool.

    Args:
        cfg: model dimensions.
        dtype: index K storage dtype.
        latent_itemsize: bytes per latent element: 4 for the fp32 test vehicle, 2 for the
            bf16 latent of the production models.
    """
    index_itemsize = 1 if dtype is IndexKDtype.FP8_E4M3 else 4
    return cfg.kv_dim * latent_itemsize + cfg.index_head_dim * index_itemsize + 4


def kv_bytes_per_page(cfg: ModelConfig, dtype: IndexKDtype, page_size: int) -> int:
    """Bytes one page occupies across all layers (the test vehicle's fp32 latent)."""
    return page_size * kv_bytes_per_token(cfg, dtype) * cfg.num_layers


_ALIGN = 64
"""Byte alignment of every tensor carved from a pool arena."""


def _arena_parts(
    cfg: ModelConfig, num_locs: int, dtype: IndexKDtype
) -> list[tuple[int, tuple[int, ...], torch.dtype]]:
    """``(byte offset, shape, dtype)`` of every pool tensor in an arena, layer by layer:
    latent, index K, scale."""
    shapes: tuple[tuple[tuple[int, ...], torch.dtype], ...] = (
        ((num_locs, cfg.kv_dim), torch.float32),
        ((num_locs, cfg.index_head_dim), index_k_torch_dtype(dtype)),
        ((num_locs,), torch.float32),
    )
    parts: list[tuple[int, tuple[int, ...], torch.dtype]] = []
    offset = 0
    for _ in range(cfg.num_layers):
        for shape, part_dtype in shapes:
            parts.append((offset, shape, part_dtype))
            nbytes = part_dtype.itemsize * int(torch.Size(shape).numel())
            offset += -(-nbytes // _ALIGN) * _ALIGN
    return parts


def arena_bytes(cfg: ModelConfig, num_pages: int, page_size: int, dtype: IndexKDtype) -> int:
    """Bytes of the one flat buffer a pool of ``num_pages`` pages can be carved from."""
    offset, shape, part_dtype = _arena_parts(cfg, num_pages * page_size, dtype)[-1]
    return offset + part_dtype.itemsize * int(torch.Size(shape).numel())


def carve_layers(
    cfg: ModelConfig, num_pages: int, page_size: int, dtype: IndexKDtype, arena: Tensor
) -> tuple[KVRows, ...]:
    """The per-layer pool tensors as views of ``arena`` (``[arena_bytes]`` uint8), the
    layout ``arena_bytes`` sizes: a pool and its peers' mappings share it."""
    need = arena_bytes(cfg, num_pages, page_size, dtype)
    if arena.dtype != torch.uint8 or arena.dim() != 1 or arena.numel() < need:
        raise ValueError(
            f"a pool arena must be a flat uint8 tensor of >= {need} bytes, got "
            f"{arena.dtype} {tuple(arena.shape)}"
        )
    views = [
        arena[offset : offset + part_dtype.itemsize * int(torch.Size(shape).numel())]
        .view(part_dtype)
        .view(shape)
        for offset, shape, part_dtype in _arena_parts(cfg, num_pages * page_size, dtype)
    ]
    return tuple(KVRows(*views[i : i + 3]) for i in range(0, len(views), 3))


class PagedKVPool:
    """One rank's paged KV storage: per layer, token rows of latent KV, index K and scale.

    Replicated (phase 0 and 1): ``num_pages`` is the whole logical space and row ``loc``
    holds logical loc ``loc``. Sharded (phase >= 2): ``num_pages`` is the rank's physical
    pages and row ``physical_loc(loc)`` holds an owned logical loc (``ownership``).
    Invariant: ``rows = num_pages * page_size`` per layer.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        num_pages: int,
        page_size: int,
        dtype: IndexKDtype,
        device: torch.device | str = "cpu",
        arena: Tensor | None = None,
        latent: LatentStorage | None = None,
    ) -> None:
        """``arena``: a zeroed flat uint8 buffer to carve the layers from (``carve_layers``;
        shared memory its peers map); None allocates each tensor on ``device``.
        ``latent``: the latent rows' storage; None is the test vehicle's (``vehicle_latent``).
        """
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f"pool needs num_pages >= 1 and page_size >= 1, got {num_pages}, {page_size}"
            )
        if arena is not None and latent is not None:
            raise ValueError("a pool carved from an arena stores the test vehicle's latent")
        self.cfg = cfg
        self.num_pages = num_pages
        self.page_size = page_size
        self.dtype = dtype
        self.latent = vehicle_latent(cfg) if latent is None else latent
        num_locs = num_pages * page_size
        k_dtype = index_k_torch_dtype(dtype)
        if arena is not None:
            self.layers = carve_layers(cfg, num_pages, page_size, dtype, arena)
            return
        self.layers = tuple(
            KVRows(
                latent=torch.zeros(
                    num_locs, self.latent.width, dtype=self.latent.dtype, device=device
                ),
                index_k=torch.zeros(num_locs, cfg.index_head_dim, dtype=k_dtype, device=device),
                index_k_scale=torch.zeros(num_locs, device=device),
            )
            for _ in range(cfg.num_layers)
        )

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token occupies across all layers."""
        return self.row_bytes * self.cfg.num_layers

    @property
    def row_bytes(self) -> int:
        """Bytes one token occupies in one layer: latent, index K and its scale."""
        index_k = self.cfg.index_head_dim * index_k_torch_dtype(self.dtype).itemsize
        return self.latent.row_bytes + index_k + 4

    def bytes_for_pages(self, num_pages: int) -> int:
        """Bytes that ``num_pages`` pages occupy across all layers."""
        return num_pages * self.page_size * self.bytes_per_token

    def write(self, layer: int, rows_index: Tensor, rows: KVRows) -> None:
        """Stores ``rows`` at token rows ``rows_index [n]`` of ``layer`` (``copy_rows_``, an
        ``index_copy_``: no host synchronisation on CUDA)."""
        pool = self.layers[layer]
        copy_rows_(pool.latent, rows_index, rows.latent)
        copy_rows_(pool.index_k, rows_index, rows.index_k)
        copy_rows_(pool.index_k_scale, rows_index, rows.index_k_scale)

    def save_rows(self, rows_index: Tensor) -> SavedRows:
        """Copies token rows ``rows_index [n]`` of every layer (device ops, no host read), so
        that a batch that fails after writing them can be undone with ``restore_rows``."""
        return SavedRows(rows_index, tuple(layer.select(rows_index) for layer in self.layers))

    def restore_rows(self, saved: SavedRows) -> None:
        """Writes ``saved`` back: the rows are as they were when it was taken."""
        for layer, values in enumerate(saved.layers):
            self.write(layer, saved.rows, values)

    def read(self, layer: int, rows_index: Tensor) -> KVRows:
        """Gathers token rows ``rows_index [n]`` of ``layer``."""
        return self.layers[layer].select(rows_index)
