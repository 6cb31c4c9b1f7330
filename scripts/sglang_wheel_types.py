"""Annotation types of SGLang's argument fields, read from ``ast`` by the rules of the wheel's
``sglang/srt/arg_groups/arg_utils.py`` (``_unwrap_optional``, ``_unwrap_literal``,
``_infer_type_func``); used by ``sglang_flag_table.py``.
"""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["SCALAR_TYPES", "TYPE_PARSERS", "infer_type", "type_tree", "union", "unwrap_optional"]

SCALAR_TYPES = {"int": "int", "float": "float", "str": "str"}
TYPE_PARSERS = {"json.loads": "loads"}
"""``type_parser=`` expressions whose runtime ``__name__`` differs from their spelling."""


def type_tree(node: ast.expr) -> Any:
    """An annotation as ``("name", id)`` or ``("sub", base, [args])``; unions flattened."""
    if isinstance(node, ast.Constant):
        return ("const", node.value)
    if isinstance(node, ast.Name):
        return ("name", node.id)
    if isinstance(node, ast.Attribute):
        return ("name", node.attr)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return union([type_tree(node.left), type_tree(node.right)])
    if isinstance(node, ast.Subscript):
        base = type_tree(node.value)[1]
        items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        args = [type_tree(a) for a in items]
        if base == "Optional":
            return union([*args, ("name", "None")])
        if base == "Union":
            return union(args)
        return ("sub", base, args)
    raise ValueError(f"cannot read annotation {ast.unparse(node)}")


def union(members: list[Any]) -> Any:
    flat: list[Any] = []
    for member in members:
        for item in member[2] if member[0] == "sub" and member[1] == "Union" else [member]:
            if item not in flat:
                flat.append(item)
    return ("sub", "Union", flat)


def unwrap_optional(tree: Any) -> Any:
    if tree[0] == "sub" and tree[1] == "Union":
        non_none = [a for a in tree[2] if a != ("name", "None") and a != ("const", None)]
        if len(non_none) == 1:
            return non_none[0]
    return tree


def infer_type(tree: Any) -> str:
    return SCALAR_TYPES.get(tree[1], "str") if tree[0] == "name" else "str"
