"""JSON schemas whose only documents are infinite (a required `$ref` back to
themselves) are refused before a grammar is built; recursive schemas with an end, and
what the check does not model, go through. What it cannot see (anchors, absolute
`$id`s) the grammar check catches where the grammar forces an endless start."""

from __future__ import annotations

from typing import Any

import pytest

from support.engine import model
from warmfleet_daemon.engine.finite_schema import no_finite_instance
from warmfleet_daemon.engine.grammar import GrammarCompiler, GrammarError, json_schema_grammar

NODE = {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}, "required": ["next"]}

ENDLESS: dict[str, tuple[Any, str]] = {
    "required self": (
        {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
        "'#' at #/properties/x",
    ),
    "through $defs": ({"$defs": {"node": NODE}, "$ref": "#/$defs/node"}, "#/$defs/node/"),
    "mutual, through items": (
        {
            "$defs": {
                "a": {
                    "type": "object",
                    "properties": {"b": {"$ref": "#/$defs/b"}},
                    "required": ["b"],
                },
                "b": {"type": "array", "items": {"$ref": "#/$defs/a"}, "minItems": 1},
            },
            "$ref": "#/$defs/a",
        },
        "'#/$defs/a' at #/$defs/b/items",
    ),
    "a required string, then itself": (
        {
            "type": "object",
            "properties": {"s": {"type": "string"}, "x": {"$ref": "#"}},
            "required": ["s", "x"],
        },
        "at #/properties/x",
    ),
    "prefixItems": (
        {"type": "array", "prefixItems": [{"type": "string"}, {"$ref": "#"}], "minItems": 2},
        "at #/prefixItems/1",
    ),
    "allOf": ({"allOf": [{"$ref": "#/$defs/node"}], "$defs": {"node": NODE}}, "#/$defs/node"),
    "an optional property into an endless definition": (
        {"type": "object", "properties": {"o": {"$ref": "#/$defs/node"}}, "$defs": {"node": NODE}},
        "matches #/properties/o",
    ),
    "an anyOf branch": (
        {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}], "$defs": {"node": NODE}},
        "matches #/anyOf/1",
    ),
    "a nested $id": (
        {
            "type": "object",
            "properties": {"p": {"$id": "urn:p", **NODE, "properties": {"next": {"$ref": "#"}}}},
        },
        "'#' at #/properties/p/properties/next",
    ),
    "an escaped pointer": (
        {
            "$defs": {"a/b": {**NODE, "properties": {"next": {"$ref": "#/$defs/a~1b"}}}},
            "$ref": "#/$defs/a~1b",
        },
        "'#/$defs/a~1b'",
    ),
}

FINITE: dict[str, Any] = {
    "optional self": {"type": "object", "properties": {"x": {"$ref": "#"}}},
    "a list of itself": {"type": "array", "items": {"$ref": "#"}},
    "nullable": {"type": ["object", "null"], "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
    "a linked list": {
        "$defs": {
            "n": {
                "type": "object",
                "properties": {"next": {"anyOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}},
                "required": ["next"],
            }
        },
        "$ref": "#/$defs/n",
    },
    "a tree": {
        "$defs": {
            "t": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
                "required": ["kids"],
            }
        },
        "$ref": "#/$defs/t",
    },
    "another branch ends it": {
        "anyOf": [
            {"type": "integer"},
            {"type": "object", "properties": {"x": {"$ref": "#"}}, "required": ["x"]},
        ]
    },
    "a forbidden property": {"type": "object", "properties": {"x": False, "y": {"type": "string"}}},
    "a remote $ref": {"$ref": "https://example.com/schema.json"},
    "not a schema at all": {"type": 5, "required": "x", "properties": [], "allOf": {}, "$ref": 3},
    "an unused endless definition": {"type": "string", "$defs": {"node": NODE}},
}


@pytest.mark.parametrize("case", ENDLESS)
def test_endless_schemas_are_named_with_the_ref_that_closes_the_loop(case: str) -> None:
    schema, where = ENDLESS[case]
    why = no_finite_instance(schema)
    assert why is not None and "recurse without end" in why and where in why, why
    with pytest.raises(GrammarError, match="recurse without end"):
        json_schema_grammar(schema)


@pytest.mark.parametrize("case", FINITE)
def test_schemas_with_finite_documents_go_through(case: str) -> None:
    assert no_finite_instance(FINITE[case]) is None


@pytest.mark.parametrize(
    "schema",
    [
        {
            "$defs": {"n": {**NODE, "$anchor": "node", "properties": {"next": {"$ref": "#node"}}}},
            "$ref": "#node",
        },
        {
            "$id": "https://example.com/n",
            **NODE,
            "properties": {"next": {"$ref": "https://example.com/n"}},
        },
    ],
)
def test_an_endless_start_the_check_cannot_see_fails_the_grammar_check(schema: Any) -> None:
    grammar = json_schema_grammar(schema)  # anchors and absolute $ids: not resolved there
    with pytest.raises(GrammarError, match="Too many items"):
        GrammarCompiler(model("tiny-random").tokenizer).check(grammar)
