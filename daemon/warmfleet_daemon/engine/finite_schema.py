"""Whether a JSON schema admits a finite document.

A schema whose required properties (or required items) lead back to itself through
`$ref` describes only infinite documents: llguidance compiles it, then fails on the
first token ("Too many items"), after the request was accepted. This finds it first:
the least fixpoint of "has a finite instance" over the subschemas, as for the
productive symbols of a grammar. It errs one way only: what it does not model (`not`,
`if`, patterns, remote or anchor `$ref`s, ...) counts as satisfiable, so a schema it
refuses really has no finite instance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

_UNKNOWN = object()  # a `$ref` this module does not resolve: counted as satisfiable
_MAX_PASSES = 64  # over the subschemas; past it (never seen), the schema is let through

Finite = Callable[[Any], bool]


@dataclass
class _Node:
    schema: dict[str, Any]
    base: dict[str, Any]  # what "#..." means inside it: the nearest `$id`, or the root
    parent: int  # the node it was found from (-1: none)
    step: str  # the pointer step from there; "#..." for the root and `$ref` targets


def no_finite_instance(schema: Any) -> str | None:
    """Why `schema` cannot be enforced: no finite JSON document matches it, or a part a
    document may enter (an optional property, an anyOf branch) recurses through `$ref`
    without end; None when neither holds or this cannot tell."""
    if schema is False:
        return "the schema `false` matches nothing"
    if not isinstance(schema, dict):
        return None
    nodes, index = _subschemas(schema)
    finite: set[int] = set()

    def ok(sub: Any) -> bool:
        return sub is not False and (not isinstance(sub, dict) or id(sub) in finite)

    for _ in range(_MAX_PASSES):
        grew = False
        for node in reversed(nodes):  # children were found after their parents
            if id(node.schema) not in finite and _failing(node, ok) is None:
                finite.add(id(node.schema))
                grew = True
        if not grew:
            break
    else:
        return None  # not settled (never seen): let it through
    explored: set[int] = set()
    for start in nodes:  # the root first
        if id(start.schema) not in finite and id(start.schema) not in explored:
            closing = _loop(start, nodes, index, ok, explored)
            if closing is not None:
                return (
                    "no finite JSON document matches "
                    f"{'it' if start is nodes[0] else _pointer(nodes, index[id(start.schema)])}"
                    ': its required properties or items recurse without end through "$ref": '
                    f"{closing.schema['$ref']!r} at {_pointer(nodes, index[id(closing.schema)])}"
                )
            if start is nodes[0]:
                return "no finite JSON document matches it"
    return None


def _loop(
    start: _Node, nodes: list[_Node], index: dict[int, int], ok: Finite, explored: set[int]
) -> _Node | None:
    """Follow what fails from `start`; if it comes round, the node whose `$ref` closes
    the loop. Every node it passes is `explored` (what follows from it is known)."""
    path: list[_Node] = []
    on_path: dict[int, int] = {}
    at = start
    while True:
        on_path[id(at.schema)] = len(path)
        path.append(at)
        explored.add(id(at.schema))
        sub = _failing(at, ok)
        if not isinstance(sub, dict):
            return None
        if id(sub) in on_path:
            loop = path[on_path[id(sub)] :]
            closing = [
                n for n in loop if _failing(n, ok) is _resolve(n.schema.get("$ref"), n.base)[0]
            ]
            return closing[-1] if closing else None
        if id(sub) in explored:
            return None
        at = nodes[index[id(sub)]]


def _failing(node: _Node, ok: Finite) -> Any | None:
    """A subschema without a finite instance (a schema before `false`) that every
    instance of `node` would contain, given `ok`; None if `node` has a finite instance."""
    s = node.schema
    target, _ = _resolve(s.get("$ref"), node.base)
    failing = [target] if target is not _UNKNOWN and not ok(target) else []
    failing += [sub for sub in _list(s.get("allOf")) if not ok(sub)]
    for key in ("anyOf", "oneOf"):
        branches = _list(s.get(key))
        if branches and not any(ok(sub) for sub in branches):
            failing.append(branches[0])
    types = s.get("type")
    types = [types] if isinstance(types, str) else types
    given = "const" in s or "enum" in s  # a value is given: its type part holds
    if not given and isinstance(types, list) and types:  # no type: some scalar will do
        missing = [[sub for sub in _needed(s, kind) if not ok(sub)] for kind in types]
        if all(missing):
            failing += missing[0]
    return next((sub for sub in failing if isinstance(sub, dict)), next(iter(failing), None))


def _needed(s: dict[str, Any], kind: Any) -> list[Any]:
    """Subschemas that each instance of type `kind` under `s` contains a value of."""
    if kind == "object":
        properties = s.get("properties")
        if not isinstance(properties, dict):
            return []  # a required name matched by patterns or additionalProperties: unknown
        return [properties[n] for n in _list(s.get("required")) if n in properties]
    if kind != "array":
        return []
    least = s.get("minItems", 0)
    least = least if isinstance(least, int) and not isinstance(least, bool) else 0
    if "prefixItems" in s:  # 2020-12
        prefix, rest = _list(s["prefixItems"]), s.get("items")
    elif isinstance(s.get("items"), list):  # draft 4 to 2019-09 tuples
        prefix, rest = s["items"], s.get("additionalItems")
    else:
        prefix, rest = [], s.get("items")
    needed = prefix[:least]
    if least > len(prefix) and rest is not None:
        needed.append(rest)
    times = s.get("minContains", 1)
    if "contains" in s and not (isinstance(times, int) and times <= 0):
        needed.append(s["contains"])
    return needed


def _subschemas(root: dict[str, Any]) -> tuple[list[_Node], dict[int, int]]:
    """Every subschema `_failing` may ask about, each once, parents before children;
    and each one's index by id."""
    nodes: list[_Node] = []
    index: dict[int, int] = {}
    stack: list[tuple[Any, dict[str, Any], int, str]] = [(root, root, -1, "#")]
    while stack:
        schema, base, parent, step = stack.pop()
        if not isinstance(schema, dict) or id(schema) in index:
            continue
        if "$id" in schema and schema is not root:
            base = schema
        here = index[id(schema)] = len(nodes)
        nodes.append(_Node(schema, base, parent, step))
        children: list[tuple[Any, str]] = []
        for key in ("allOf", "anyOf", "oneOf", "prefixItems", "items"):
            children += [(sub, f"{key}/{i}") for i, sub in enumerate(_list(schema.get(key)))]
        for key in ("properties", "patternProperties"):
            named = schema.get(key)
            if isinstance(named, dict):
                children += [(sub, f"{key}/{_escape(n)}") for n, sub in named.items()]
        extra = ("items", "additionalItems", "contains", "additionalProperties")
        children += [(schema.get(key), key) for key in extra]
        stack += [(sub, base, here, sub_step) for sub, sub_step in reversed(children)]
        target, target_base = _resolve(schema.get("$ref"), base)
        if isinstance(target, dict):  # the first to pop: the loop is found where it closes
            stack.append((target, target_base, here, schema["$ref"]))
    return nodes, index


def _resolve(ref: Any, base: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The subschema a local `$ref` ("#" or "#/json/pointer") names and the base of
    the references inside it; (_UNKNOWN, base) for any other `$ref`."""
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        return _UNKNOWN, base
    at: Any = base
    for part in ref[2:].split("/") if ref != "#" else []:
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(at, dict) and part in at:
            at = at[part]
        elif isinstance(at, list) and part.isdigit() and int(part) < len(at):
            at = at[int(part)]
        else:
            return _UNKNOWN, base  # llguidance says what is wrong with it
        if isinstance(at, dict) and "$id" in at:
            base = at
    return at, base


def _pointer(nodes: list[_Node], at: int) -> str:
    """Where node `at` is: from the root, or from the `$ref` it was reached through."""
    steps: list[str] = []
    while not nodes[at].step.startswith("#"):
        steps.append(nodes[at].step)
        at = nodes[at].parent
    return "/".join([nodes[at].step, *reversed(steps)])


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
