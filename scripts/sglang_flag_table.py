"""SGLang's command-line flag table, read from the pinned wheel as data (``ast``, no import).

SGLang 0.5.23 declares its server arguments as annotated fields of the namespace classes in
``sglang/srt/arg_groups/fields/*.py`` (``A[T, "help"]`` or ``A[T, Arg(...)]``), turned into
argparse options by ``arg_utils.add_cli_args_from_dataclass``; a few more are added by hand in
``ServerArgs.add_cli_args`` (``sglang/srt/server_args.py``). Its runtime does not import on a
CPU machine, so this script reads those files with ``ast`` and applies the same rules:

    python scripts/sglang_flag_table.py                 # write flags/sglang/data/sglang-0.5.23.json
    python scripts/sglang_flag_table.py --check         # exit 1 when the file drifted

``tests/test_sglang_table.py`` runs :func:`read_wheel_table` on the wheel that
``scripts/setup.sh`` downloads into ``.whl/`` and compares it with the committed file.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # NOTE: run as a file, not a package

from sglang_wheel_ast import Scope, Wheel, evaluate, evaluate_name
from sglang_wheel_types import SCALAR_TYPES, TYPE_PARSERS, infer_type, type_tree, unwrap_optional

SGLANG_VERSION = "0.5.23"
ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "flags" / "data" / f"sglang-{SGLANG_VERSION}.json"
WHEEL_DIR = ROOT / ".whl"

FIELDS_DIR = "sglang/srt/arg_groups/fields/"
SERVER_ARGS = "sglang/srt/server_args.py"
FIELD_ORDER = "sglang/srt/arg_groups/field_order.py"


def find_wheel(directory: Path = WHEEL_DIR) -> Path | None:
    """The pinned wheel in ``directory`` (``sglang-0.5.23-*.whl``), or None."""
    found = sorted(directory.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    return found[0] if found else None


# --- options ---


def _option(names: list[str], dest: str, kind: str, **details: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "options": names,
        "dest": dest,
        "kind": kind,
        "type": None,
        "nargs": None,
        "choices": None,
        "default": None,
        "required": False,
    }
    row.update(details)
    return row


def _choices(value: Any) -> list[Any] | None:
    if value is None:
        return None
    if isinstance(value, set):
        return sorted(value)
    return list(value)


def _default(node: ast.expr | None, scope: Scope) -> dict[str, Any]:
    if node is None:
        return {"default": None, "has_default": False}
    if (
        isinstance(node, ast.Call)
        and ast.unparse(node.func) == "msgspec.field"
        and node.keywords
        and node.keywords[0].arg == "default_factory"
    ):
        factory = ast.unparse(node.keywords[0].value)
        return {"default": {"list": [], "dict": {}}[factory], "has_default": True}
    try:
        value = evaluate(node, scope)
    except ValueError:
        return {"default": None, "default_expr": ast.unparse(node), "has_default": True}
    if isinstance(value, tuple):
        value = list(value)
    return {"default": value, "has_default": True}


def _arg_meta(annotation: ast.expr) -> tuple[ast.expr, dict[str, ast.expr]] | None:
    """``(inner type, Arg keyword nodes)`` of ``A[T, "help"]`` / ``A[T, Arg(...)]``; None
    for a field without CLI metadata."""
    if not (
        isinstance(annotation, ast.Subscript)
        and ast.unparse(annotation.value) in ("A", "Annotated", "typing.Annotated")
    ):
        return None
    assert isinstance(annotation.slice, ast.Tuple), ast.unparse(annotation)
    inner, *extras = annotation.slice.elts
    for extra in extras:
        if isinstance(extra, ast.Constant) and isinstance(extra.value, str):
            return inner, {}
        if isinstance(extra, ast.Call) and ast.unparse(extra.func) == "Arg":
            return inner, {k.arg: k.value for k in extra.keywords if k.arg}
    return None


def _field_option(
    name: str, annotation: ast.expr, value: ast.expr | None, scope: Scope
) -> dict[str, Any] | None:
    """One field's option, by the rules of ``arg_utils.add_cli_args_from_dataclass``."""
    meta = _arg_meta(annotation)
    if meta is None:
        return None
    inner_node, arg = meta
    if "no_cli" in arg and evaluate(arg["no_cli"], scope):
        return None
    cli_name = (
        evaluate(arg["cli_name"], scope) if "cli_name" in arg else "--" + name.replace("_", "-")
    )
    aliases = evaluate(arg["aliases"], scope) if "aliases" in arg else []
    names = [cli_name, *(aliases or [])]
    default = _default(value, scope)
    choices = _choices(evaluate(arg["choices"], scope)) if "choices" in arg else None
    nargs = evaluate(arg["nargs"], scope) if "nargs" in arg else None
    parser = ast.unparse(arg["type_parser"]) if "type_parser" in arg else None
    if "action" in arg:
        action = ast.unparse(arg["action"])
        kwargs = evaluate(arg["action_kwargs"], scope) if "action_kwargs" in arg else {}
        kind = {"argparse.BooleanOptionalAction": "boolean_optional"}.get(action, action)
        if kind == "boolean_optional":
            names = [n for cli in names for n in (cli, "--no-" + cli[2:])]
        type_name = getattr(kwargs.get("type"), "__name__", None) if kwargs else None
        nargs = 0 if kind == "boolean_optional" else kwargs.get("nargs")
        return _option(names, name, kind, nargs=nargs, type=type_name, **default)
    tree = unwrap_optional(type_tree(inner_node))
    if tree[0] == "sub" and tree[1] == "Literal":
        literal = [a[1] for a in tree[2]]
        first = type(literal[0]).__name__ if literal else "str"
        type_name = TYPE_PARSERS.get(parser or "", parser) or SCALAR_TYPES.get(first, "str")
        return _option(names, name, "store", type=type_name, choices=choices or literal, **default)
    if tree[0] == "sub" and tree[1] in ("List", "list") and parser is None:
        elem = tree[2][0] if tree[2] else ("name", "str")
        return _option(
            names,
            name,
            "store",
            type=infer_type(elem),
            nargs=nargs or "+",
            choices=choices,
            **default,
        )
    if tree == ("name", "bool"):
        return _option(names, name, "store_true", **default)
    type_name = TYPE_PARSERS.get(parser or "", parser) or infer_type(tree)
    required_node = arg.get("required")
    required = evaluate(required_node, scope) if required_node is not None else None
    is_required = required is True or (required is None and not default["has_default"])
    return _option(
        names,
        name,
        "store",
        type=type_name,
        nargs=nargs,
        choices=choices,
        required=is_required,
        **default,
    )


def _namespace_classes(wheel: Wheel) -> list[tuple[str, ast.ClassDef, str]]:
    """``(class name, class node, module path)`` in ``_INPUT_NAMESPACES`` order."""
    server = wheel.module(SERVER_ARGS)
    order = next(
        [e.id for e in node.value.elts if isinstance(e, ast.Name)]
        for node in server.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets)
        and isinstance(node.value, ast.List)
    )
    classes: dict[str, tuple[ast.ClassDef, str]] = {}
    for path in wheel.names(FIELDS_DIR):
        for node in wheel.module(path).body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (node, path)
    return [(name, *classes[name]) for name in order]


def _field_options(wheel: Wheel) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The fields' options in ``ServerArgs`` order, and every field's default."""
    collected: dict[str, tuple[ast.expr, ast.expr | None, Scope]] = {}
    for _, cls, path in _namespace_classes(wheel):
        scope = Scope(wheel, path, classes=())
        for statement in cls.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                collected[statement.target.id] = (statement.annotation, statement.value, scope)
    positional = evaluate_name("POSITIONAL_FIELD_ORDER", Scope(wheel, FIELD_ORDER))
    ordered = [n for n in positional if n in collected]
    ordered += [n for n in collected if n not in set(positional)]
    options = []
    for name in ordered:
        annotation, value, scope = collected[name]
        option = _field_option(name, annotation, value, scope)
        if option is not None:
            options.append(option)
    defaults = {
        name: _default(value, scope)["default"] for name, (_, value, scope) in collected.items()
    }
    return options, defaults


def _manual_options(wheel: Wheel) -> list[dict[str, Any]]:
    """The ``parser.add_argument`` calls of ``ServerArgs.add_cli_args``."""
    server = wheel.module(SERVER_ARGS)
    method = next(
        node
        for cls in server.body
        if isinstance(cls, ast.ClassDef) and cls.name == "ServerArgs"
        for node in cls.body
        if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args"
    )
    local: dict[str, Any] = {}
    options = []
    for statement in method.body:
        if isinstance(statement, ast.Assign) and isinstance(statement.targets[0], ast.Name):
            local[statement.targets[0].id] = statement.value
            continue
        call = statement.value if isinstance(statement, ast.Expr) else None
        if not (isinstance(call, ast.Call) and ast.unparse(call.func) == "parser.add_argument"):
            continue
        options.append(_manual_option(call, Scope(wheel, SERVER_ARGS, local)))
    return options


def _manual_option(call: ast.Call, scope: Scope) -> dict[str, Any]:
    names = [evaluate(a, scope) for a in call.args]
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    dest = evaluate(kw["dest"], scope) if "dest" in kw else names[0][2:].replace("-", "_")
    action = ast.unparse(kw["action"]) if "action" in kw else "store"
    kind = {
        "'store_true'": "store_true",
        "DeprecatedStoreTrueAction": "deprecated_store_true",
        "DeprecatedStoreConstAction": "deprecated_store_const",
    }.get(action, action)
    default = (
        _evaluate_default_call(kw["default"], scope)
        if "default" in kw
        else {"default": False if kind.endswith("store_true") else None}
    )
    row = _option(
        names,
        dest,
        kind,
        type=ast.unparse(kw["type"]) if "type" in kw else None,
        choices=_choices(evaluate(kw["choices"], scope)) if "choices" in kw else None,
        **default,
    )
    if "new_flag" in kw:
        row["new_flag"] = evaluate(kw["new_flag"], scope)
    if "const_value" in kw:
        row["const"] = evaluate(kw["const_value"], scope)
    return row


def _evaluate_default_call(node: ast.expr, scope: Scope) -> dict[str, Any]:
    """``default=_declared_default("name")`` is the field's own default: recorded as such."""
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "_declared_default":
        return {"default": None, "default_of_field": evaluate(node.args[0], scope)}
    return {"default": evaluate(node, scope)}


def read_wheel_table(wheel_path: Path) -> dict[str, Any]:
    """Every option ``sglang serve`` parses, in registration order, read from the wheel."""
    wheel = Wheel(wheel_path)
    options = [_option(["-h", "--help"], "help", "help")]
    fields, defaults = _field_options(wheel)
    manual = _manual_options(wheel)
    for row in manual:
        source = row.pop("default_of_field", None)
        if source is not None:
            row["default"] = defaults[source]
    for row in fields:
        row.pop("has_default", None)
    return {"sglang": SGLANG_VERSION, "options": options + fields + manual}


def dump_table(table: dict[str, Any]) -> str:
    """The table's file text: one option a line, so that a drift reads as a one-line diff."""
    rows = ",\n".join("  " + json.dumps(o, sort_keys=True) for o in table["options"])
    return f'{{"sglang": "{table["sglang"]}", "options": [\n{rows}\n]}}\n'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help="the sglang wheel (default: .whl/)")
    parser.add_argument("--out", type=Path, default=TABLE)
    parser.add_argument("--check", action="store_true", help="exit 1 if --out differs")
    args = parser.parse_args(argv)
    wheel = args.wheel or find_wheel()
    if wheel is None:
        print(f"no sglang-{SGLANG_VERSION} wheel in {WHEEL_DIR}: run scripts/setup.sh")
        return 2
    text = dump_table(read_wheel_table(wheel))
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'differs from ' + wheel.name}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(json.loads(text)['options'])} options from {wheel.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
