"""Constant expressions of SGLang's source, evaluated from the wheel without importing it.

``scripts/sglang_flag_table.py`` reads SGLang's argument declarations with ``ast``; their
choices and defaults name constants of other modules (``choices=ATTENTION_BACKEND_CHOICES``,
``Backend.ALL``, ``_reasoning_parser_choices()``). :func:`evaluate` follows those names
through the wheel's modules: literals, ``+``/``*``/``**``/``<<``, names and imports, class
attributes, ``set``/``list``/``tuple`` calls, enum members, zero-argument helpers and simple
list comprehensions. Anything else raises ``ValueError``.
"""

from __future__ import annotations

import ast
import operator
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_OPERATORS: dict[type[ast.operator], Any] = {
    ast.Add: operator.add,
    ast.Mult: operator.mul,
    ast.Pow: operator.pow,
    ast.LShift: operator.lshift,
}
_BUILTIN_TYPES = {"str": str, "int": int, "float": float}


class Wheel:
    """The wheel's Python sources, parsed on demand."""

    def __init__(self, path: Path) -> None:
        self._zip = zipfile.ZipFile(path)
        self._trees: dict[str, ast.Module] = {}

    def module(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self._zip.read(path).decode(), path)
        return self._trees[path]

    def names(self, prefix: str) -> list[str]:
        return sorted(n for n in self._zip.namelist() if n.startswith(prefix) and n.endswith(".py"))


def _module_path(dotted: str) -> str:
    return dotted.replace(".", "/") + ".py"


@dataclass
class Scope:
    """Where a name is looked up: a function's locals, a class body, then its module."""

    wheel: Wheel
    path: str
    local: dict[str, Any] = field(default_factory=dict)
    """Names bound in a function: an ``ast.expr``, an :class:`_Imported` or a :class:`_Bound`."""
    classes: tuple[ast.ClassDef, ...] = ()

    def module_defs(self) -> dict[str, Any]:
        defs: dict[str, Any] = {}
        for node in self.wheel.module(self.path).body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        defs[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.value is not None:
                    defs[node.target.id] = node.value
            elif isinstance(node, ast.ClassDef | ast.FunctionDef):
                defs[node.name] = node
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    defs[alias.asname or alias.name] = _Imported(node.module, alias.name)
        return defs


@dataclass(frozen=True)
class _Imported:
    """A name a module imports: evaluated in the module it comes from."""

    module: str
    name: str


@dataclass(frozen=True)
class _Bound:
    """A comprehension variable's current value."""

    value: Any


def evaluate(node: ast.AST, scope: Scope) -> Any:
    """A constant expression of SGLang's flag declarations, evaluated without importing it."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple):
        values = [evaluate(e, scope) for e in node.elts]
        return values if isinstance(node, ast.List) else tuple(values)
    if isinstance(node, ast.Set):
        return {evaluate(e, scope) for e in node.elts}
    if isinstance(node, ast.Dict):
        return {
            evaluate(k, scope): evaluate(v, scope)
            for k, v in zip(node.keys, node.values, strict=True)
            if k is not None
        }
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -evaluate(node.operand, scope)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](evaluate(node.left, scope), evaluate(node.right, scope))
    if isinstance(node, ast.Name):
        return evaluate_name(node.id, scope)
    if isinstance(node, ast.Attribute):
        return _evaluate_attribute(node, scope)
    if isinstance(node, ast.Call):
        return _evaluate_call(node, scope)
    if isinstance(node, ast.ListComp):
        return _evaluate_listcomp(node, scope)
    if isinstance(node, ast.FunctionDef):
        return lambda: _evaluate_function(node, scope)
    if isinstance(node, ast.ClassDef):
        return _ClassValue(node, scope)
    raise ValueError(f"{scope.path}: cannot evaluate {ast.unparse(node)}")


@dataclass(frozen=True)
class _ClassValue:
    node: ast.ClassDef
    scope: Scope

    def attribute(self, name: str) -> Any:
        for statement in self.node.body:
            if isinstance(statement, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in statement.targets
            ):
                inner = Scope(self.scope.wheel, self.scope.path, {}, (self.node,))
                return evaluate(statement.value, inner)
        raise ValueError(f"{self.scope.path}: {self.node.name} has no {name}")

    def members(self) -> list[str]:
        """An enum's member names, in declaration order."""
        return [
            t.id
            for s in self.node.body
            if isinstance(s, ast.Assign)
            for t in s.targets
            if isinstance(t, ast.Name) and not t.id.startswith("_")
        ]


def evaluate_name(name: str, scope: Scope) -> Any:
    if name in scope.local:
        return _evaluate_binding(scope.local[name], scope)
    for cls in reversed(scope.classes):
        for statement in cls.body:
            if isinstance(statement, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in statement.targets
            ):
                return evaluate(statement.value, scope)
    found = scope.module_defs().get(name)
    if found is None and name in _BUILTIN_TYPES:
        return _BUILTIN_TYPES[name]
    if found is None:
        raise ValueError(f"{scope.path}: {name} is not defined")
    return _evaluate_binding(found, Scope(scope.wheel, scope.path))


def _evaluate_binding(binding: Any, scope: Scope) -> Any:
    if isinstance(binding, _Bound):
        return binding.value
    if isinstance(binding, _Imported):
        return evaluate_name(binding.name, Scope(scope.wheel, _module_path(binding.module)))
    return evaluate(binding, scope)


def _evaluate_attribute(node: ast.Attribute, scope: Scope) -> Any:
    owner = evaluate(node.value, scope)
    if isinstance(owner, _ClassValue):
        return owner.attribute(node.attr)
    if isinstance(owner, _EnumMember) and node.attr == "name":
        return owner.name
    if isinstance(owner, str) and node.attr == "lower":
        return owner.lower
    raise ValueError(f"{scope.path}: cannot evaluate {ast.unparse(node)}")


@dataclass(frozen=True)
class _EnumMember:
    name: str


def _evaluate_call(node: ast.Call, scope: Scope) -> Any:
    if isinstance(node.func, ast.Name) and node.func.id in ("set", "frozenset", "list", "tuple"):
        if not node.args:
            return {"set": set, "frozenset": set, "list": list, "tuple": tuple}[node.func.id]()
        value = evaluate(node.args[0], scope)
        if isinstance(value, _ClassValue):
            value = [_EnumMember(m) for m in value.members()]
        return {"set": set, "frozenset": set, "list": list, "tuple": tuple}[node.func.id](value)
    func = evaluate(node.func, scope)
    if callable(func) and not node.args:
        return func()
    raise ValueError(f"{scope.path}: cannot evaluate {ast.unparse(node)}")


def _evaluate_listcomp(node: ast.ListComp, scope: Scope) -> list[Any]:
    (generator,) = node.generators
    assert isinstance(generator.target, ast.Name), ast.unparse(node)
    values = []
    for item in evaluate(generator.iter, scope):
        inner = Scope(scope.wheel, scope.path, dict(scope.local), scope.classes)
        inner.local[generator.target.id] = _Bound(item)
        values.append(evaluate(node.elt, inner))
    return values


def _evaluate_function(node: ast.FunctionDef, scope: Scope) -> Any:
    """A zero-argument helper's last return value; its own imports resolve in the wheel."""
    local: dict[str, Any] = {}
    for statement in ast.walk(node):
        if isinstance(statement, ast.ImportFrom) and statement.module:
            for alias in statement.names:
                local[alias.asname or alias.name] = _Imported(statement.module, alias.name)
    returns = [s for s in node.body if isinstance(s, ast.Return) and s.value is not None]
    inner = Scope(scope.wheel, scope.path, local)
    return evaluate(returns[-1].value, inner)  # type: ignore[arg-type]
