"""A radix tree of token pages: what SGLang's radix cache can hit, page-aligned."""

from __future__ import annotations

from collections.abc import Sequence

from cpkv.synth.workload import PageKey


class _Node:
    __slots__ = ("children", "writer")

    def __init__(self, writer: str) -> None:
        self.children: dict[PageKey, _Node] = {}
        self.writer = writer


class PageRadixTree:
    """Full pages of KV the server holds, keyed by content, one path per prefix.

    Invariant: every node's ``writer`` is a request whose first pages are exactly the path
    from the root to the node, and whose KV of them was computed in an earlier batch. A hit
    can therefore name that request as ``prefix_from``. Nothing is evicted.
    """

    def __init__(self) -> None:
        self._root = _Node("")

    def match(self, keys: Sequence[PageKey], max_pages: int) -> tuple[int, str | None]:
        """The longest cached prefix of ``keys``, at most ``max_pages`` pages.

        Returns:
            ``(pages, writer)``: the pages matched and a request holding them as its own
            first pages; ``(0, None)`` on a miss.
        """
        node, pages = self._root, 0
        for key in keys[:max_pages]:
            child = node.children.get(key)
            if child is None:
                break
            node, pages = child, pages + 1
        return pages, (node.writer if pages else None)

    def insert(self, writer: str, keys: Sequence[PageKey]) -> None:
        """Caches ``writer``'s first ``len(keys)`` pages; pages cached before keep their
        writer (SGLang keeps the first copy and frees the duplicate)."""
        node = self._root
        for key in keys:
            child = node.children.get(key)
            if child is None:
                child = node.children[key] = _Node(writer)
            node = child
