"""The pure reconcile core: no I/O, no kopf."""

from __future__ import annotations

import json

import pytest
import yaml

from warmfleet_common.contract import PromptState, WarmPromptStatus, WarmSetSpec, WarmSetStatus
from warmfleet_common.crd import Node, SetKey
from warmfleet_operator.objects import InvalidSpec, Observation, Push
from warmfleet_operator.reconcile import (
    changed,
    describe,
    matches,
    plan,
    referenced_configmaps,
    resolve,
    select_nodes,
    set_status,
)

NOW = "2026-11-30T00:00:00+00:00"
LATER = "2026-11-30T00:05:00+00:00"
SPEC = {"prompts": [{"name": "p", "messages": [{"role": "system", "content": "hi"}]}]}


def nodes() -> list[Node]:
    return [
        Node("a", "http://a", {"pool": "agents", "zone": "1"}),
        Node("b", "http://b", {"pool": "agents", "zone": "2"}, model="m2"),
        Node("c", "http://c", {"pool": "batch"}),
    ]


@pytest.mark.parametrize(
    ("selector", "want"),
    [
        (None, ["a", "b", "c"]),
        ({}, ["a", "b", "c"]),
        ({"matchLabels": {"pool": "agents"}}, ["a", "b"]),
        ({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["2", "3"]}]}, ["b"]),
        ({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["2"]}]}, ["a", "c"]),
        ({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}, ["a", "b"]),
        ({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}, ["c"]),
        (
            {
                "matchLabels": {"pool": "agents"},
                "matchExpressions": [{"key": "zone", "operator": "In", "values": ["1"]}],
            },
            ["a"],
        ),
    ],
)
def test_label_selectors(selector, want) -> None:
    assert [n.name for n in select_nodes(selector, nodes())] == want


def test_a_node_without_labels_matches_only_selectors_that_allow_absence() -> None:
    assert matches(None, {}) and matches({}, {})
    assert matches(
        {"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["2"]}]}, {}
    )
    assert not matches({"matchLabels": {"pool": "agents"}}, {})
    assert not matches(
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["1"]}]}, {}
    )


def test_model_filter_keeps_unprobed_nodes() -> None:
    assert [n.name for n in select_nodes(None, nodes(), "m2")] == ["a", "b", "c"]
    assert [n.name for n in select_nodes(None, nodes(), "m1")] == ["a", "c"]


def test_resolve_reads_messages_from_configmaps_and_hashes_what_it_resolved() -> None:
    spec = {
        "prompts": [
            {"name": "inline", "messages": [{"role": "system", "content": "a"}]},
            {
                "name": "cm",
                "messagesFrom": {"configMapKeyRef": {"name": "prompts", "key": "x.json"}},
            },
        ],
        "concurrency": 3,
    }
    maps = {("ns", "prompts"): {"x.json": '[{"role": "system", "content": "from the map"}]'}}
    got = resolve(spec, "ns", 7, maps)
    assert got.generation == 7 and got.concurrency == 3 and got.pin is True
    assert got.prompts[1].messages[0].content == "from the map"
    assert referenced_configmaps(spec) == {"prompts"}
    changed = {("ns", "prompts"): {"x.json": "- {role: system, content: changed}"}}
    assert resolve(spec, "ns", 7, changed).source_hash != got.source_hash
    assert resolve(spec, "ns", 8, maps).source_hash == got.source_hash  # generation alone


def test_resolve_scopes_a_set_to_its_tenants() -> None:
    spec = {"prompts": [{"name": "p", "messages": [{"role": "system", "content": "a"}]}]}
    fleet_wide = resolve(spec, "ns", 1, {})
    scoped = resolve({**spec, "tenants": ["team-a", "team-b"]}, "ns", 1, {})
    assert fleet_wide.tenants is None and scoped.tenants == ["team-a", "team-b"]
    assert scoped.source_hash != fleet_wide.source_hash  # a change of scope is pushed
    with pytest.raises(InvalidSpec) as err:
        resolve({**spec, "tenants": ["not a tenant"]}, "ns", 1, {})
    assert err.value.reason == "InvalidSpec" and "tenants" in err.value.message


@pytest.mark.parametrize(
    ("maps", "reason"),
    [
        ({}, "ConfigMapMissing"),
        ({("ns", "prompts"): {"other": "[]"}}, "ConfigMapMissing"),
        ({("ns", "prompts"): {"x.json": "{not: [a list"}}, "ConfigMapInvalid"),
        ({("ns", "prompts"): {"x.json": "just text"}}, "ConfigMapInvalid"),
        ({("ns", "prompts"): {"x.json": "[{role: wizard, content: x}]"}}, "InvalidSpec"),
    ],
)
def test_resolve_explains_what_is_wrong(maps, reason) -> None:
    spec = {
        "prompts": [
            {
                "name": "cm",
                "messagesFrom": {"configMapKeyRef": {"name": "prompts", "key": "x.json"}},
            }
        ]
    }
    with pytest.raises(InvalidSpec) as err:
        resolve(spec, "ns", 1, maps)
    assert (err.value.reason == reason and "cm" in err.value.message) or reason == "InvalidSpec"


def warm_status(spec: WarmSetSpec, states: list[PromptState]) -> WarmSetStatus:
    prompts = [
        WarmPromptStatus(
            name=f"p{i}",
            state=s,
            content_hash="h",
            tokens=10,
            error="boom" if s is PromptState.FAILED else None,
        )
        for i, s in enumerate(states)
    ]
    return WarmSetStatus(
        namespace="ns",
        name="s",
        generation=spec.generation,
        uid=spec.uid,
        source_hash=spec.source_hash,
        content_hash="c",
        concurrency=2,
        pin=True,
        prompts=prompts,
        warm=sum(s is PromptState.WARM for s in states),
        total=len(states),
        updated_at=0.0,
    )


def test_plan_pushes_only_where_missing_or_stale_and_removes_unselected_holders() -> None:
    desired = resolve(SPEC, "ns", 2, {})
    older = resolve({**SPEC, "concurrency": 5}, "ns", 1, {})
    a, b, c = nodes()
    observations = {
        "a": Observation("a", True, None),  # does not have it
        "b": Observation("b", True, warm_status(older, [PromptState.WARM])),  # stale
    }
    pushes, removes = plan(desired, [a, b], observations, holders=[b, c])
    assert [p.node.name for p in pushes] == ["a", "b"]
    assert [r.node.name for r in removes] == ["c"]
    in_sync = {"a": Observation("a", True, warm_status(desired, [PromptState.WARM]))}
    assert plan(desired, [a], in_sync, holders=[a]) == ([], [])
    down = {"a": Observation("a", False, None, "connection refused")}
    assert plan(desired, [a], down, holders=[]) == ([], [])  # retried at the next resync
    assert "pushed to a, b; removed from c" in describe(SetKey("ns", "s"), pushes, removes)


def test_plan_orders_generations_within_one_object_only() -> None:
    a, _, _ = nodes()
    v2 = resolve(SPEC, "ns", 2, {}, uid="u1")
    newer = {"a": Observation("a", True, warm_status(resolve(SPEC, "ns", 3, {}, uid="u1"), []))}
    assert plan(v2, [a], newer, holders=[]) == ([], [])  # a stale body: leave the node be
    recreated = resolve(SPEC, "ns", 1, {}, uid="u2")  # deleted and created again
    assert [p.node.name for p in plan(recreated, [a], newer, holders=[])[0]] == ["a"]
    same_generation = {"a": Observation("a", True, warm_status(v2, []))}
    edited_configmap = v2.model_copy(update={"source_hash": "other"})
    assert plan(v2, [a], same_generation, holders=[]) == ([], [])
    assert len(plan(edited_configmap, [a], same_generation, holders=[])[0]) == 1


WARM = PromptState.WARM


def pool(count: int) -> list[Node]:
    return [Node(f"n{i}", f"http://n{i}:8000", {"pool": "agents"}) for i in range(count)]


def test_a_node_joining_a_warm_pool_is_told_the_warm_nodes_as_peers() -> None:
    desired = resolve(SPEC, "ns", 1, {}, uid="u1")
    n0, n1, n2 = pool(3)
    observations = {
        "n0": Observation("n0", True, warm_status(desired, [PromptState.WARM])),
        "n1": Observation("n1", True, warm_status(desired, [PromptState.WARM])),
        "n2": Observation("n2", True, None),  # joined, or restarted without its state
    }
    pushes, _ = plan(desired, [n0, n1, n2], observations, holders=[n0, n1])
    assert [(p.node.name, p.spec.peers) for p in pushes] == [
        ("n2", ["http://n0:8000", "http://n1:8000"])
    ]
    # Only the copy source changes: the content and its hash are the set's.
    assert pushes[0].spec.model_copy(update={"peers": []}) == desired


def test_peers_still_warming_failed_or_on_other_content_are_not_named() -> None:
    desired = resolve(SPEC, "ns", 2, {}, uid="u1")
    older = resolve({**SPEC, "concurrency": 5}, "ns", 1, {}, uid="u1")
    nodes_ = pool(6)
    observations = {
        "n0": Observation("n0", True, warm_status(desired, [WARM, PromptState.WARMING])),
        "n1": Observation("n1", True, warm_status(desired, [WARM, PromptState.FAILED])),
        "n2": Observation("n2", True, warm_status(older, [PromptState.WARM])),  # old content
        "n3": Observation("n3", False, None, "connection refused"),
        "n4": Observation("n4", True, warm_status(desired, [])),  # nothing to copy
        "n5": Observation("n5", True, None),
    }
    pushes, _ = plan(desired, nodes_, observations, holders=[])
    assert [(p.node.name, p.spec.peers) for p in pushes] == [("n2", []), ("n5", [])]


def test_a_node_is_never_its_own_peer() -> None:
    desired = resolve(SPEC, "ns", 1, {}, uid="u1")
    n0, n1 = pool(2)
    alias = Node("n0-alias", n0.url)  # a second WarmNode for the same daemon
    observations = {
        "n0": Observation("n0", True, None),
        "n0-alias": Observation("n0-alias", True, warm_status(desired, [PromptState.WARM])),
        "n1": Observation("n1", True, warm_status(desired, [PromptState.WARM])),
    }
    pushes, _ = plan(desired, [n0, alias, n1], observations, holders=[])
    assert [(p.node.name, p.spec.peers) for p in pushes] == [("n0", ["http://n1:8000"])]


def test_at_most_eight_peers_and_only_of_the_same_model() -> None:
    desired = resolve(SPEC, "ns", 1, {}, uid="u1")
    warm = [Node(f"w{i:02}", f"https://w{i:02}.lan", model="m1") for i in range(10)]
    other = Node("x", "http://x", model="m2")
    new = Node("new", "http://new", model="m1")
    observations = {
        n.name: Observation(n.name, True, warm_status(desired, [PromptState.WARM]))
        for n in [*warm, other]
    }
    observations["new"] = Observation("new", True, None)
    pushes, _ = plan(desired, [new, other, *warm], observations, holders=[])
    assert [(p.node.name, p.spec.peers) for p in pushes] == [
        ("new", [f"https://w{i:02}.lan" for i in range(8)])
    ]
    WarmSetSpec.model_validate(pushes[0].spec.model_dump())  # the daemon accepts it


def test_a_peer_changing_state_causes_no_push() -> None:
    desired = resolve(SPEC, "ns", 1, {}, uid="u1")
    n0, n1 = pool(2)
    # n1 was pushed while n0 was still warming, so it got no peers and prefilled.
    warming = {
        "n0": Observation("n0", True, warm_status(desired, [PromptState.WARMING])),
        "n1": Observation("n1", True, None),
    }
    pushes, _ = plan(desired, [n0, n1], warming, holders=[n0])
    assert [(p.node.name, p.spec.peers) for p in pushes] == [("n1", [])]
    held = {p.node.name: warm_status(p.spec, [PromptState.WARMING]) for p in pushes}
    for n0_state in (PromptState.WARM, PromptState.FAILED, PromptState.WARMING):
        later = {
            "n0": Observation("n0", True, warm_status(desired, [n0_state])),
            "n1": Observation("n1", True, held["n1"]),
        }
        assert plan(desired, [n0, n1], later, holders=[n0, n1]) == ([], [])
    gone = {"n0": Observation("n0", False, None, "timed out"), "n1": later["n1"]}
    assert plan(desired, [n0, n1], gone, holders=[n0, n1]) == ([], [])


def test_status_conditions() -> None:
    desired = resolve(SPEC, "ns", 3, {})
    a, b, _ = nodes()

    def status(obs: dict, previous=(), now=NOW):  # type: ignore[no-untyped-def]
        return set_status(
            generation=3,
            selected=[a, b],
            observations=obs,
            desired=desired,
            invalid=None,
            previous=previous,
            now=now,
        )

    warm = {
        n: Observation(n, True, warm_status(desired, [PromptState.WARM, PromptState.WARM]))
        for n in "ab"
    }
    done = status(warm)
    conds = {c["type"]: c for c in done["conditions"]}
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("True", "AllWarm")
    assert conds["Progressing"]["status"] == "False" and conds["Degraded"]["status"] == "False"
    assert done["warmNodes"] == "2/2" and done["observedGeneration"] == 3
    assert [n["tokens"] for n in done["nodes"]] == [20, 20]

    warming = {
        **warm,
        "b": Observation("b", True, warm_status(desired, [PromptState.WARM, PromptState.WARMING])),
    }
    conds = {
        c["type"]: c for c in status(warming, previous=done["conditions"], now=LATER)["conditions"]
    }
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "Warming")
    assert conds["Ready"]["lastTransitionTime"] == LATER
    assert conds["Degraded"]["lastTransitionTime"] == NOW  # unchanged since
    assert conds["Progressing"]["status"] == "True"

    down = {**warm, "b": Observation("b", False, None, "connection refused")}
    result = status(down)
    conds = {c["type"]: c for c in result["conditions"]}
    assert conds["Ready"]["reason"] == conds["Degraded"]["reason"] == "NodesUnreachable"
    assert result["nodes"][1]["error"] == "connection refused" and result["warmNodes"] == "1/2"

    failed = {
        **warm,
        "a": Observation("a", True, warm_status(desired, [PromptState.WARM, PromptState.FAILED])),
    }
    conds = {c["type"]: c for c in status(failed)["conditions"]}
    assert conds["Ready"]["reason"] == "WarmUpFailed" and "boom" in conds["Degraded"]["message"]

    stale = {
        n: Observation(
            n,
            True,
            warm_status(
                resolve(SPEC, "ns", 1, {}).model_copy(update={"source_hash": "old"}),
                [PromptState.WARM],
            ),
        )
        for n in "ab"
    }
    assert status(stale)["warmNodes"] == "0/2"  # warm, but an older version


def test_status_for_invalid_specs_and_empty_selections() -> None:
    invalid = InvalidSpec("ConfigMapMissing", "ConfigMap ns/x not found")
    result = set_status(
        generation=1,
        selected=nodes()[:1],
        observations={},
        desired=None,
        invalid=invalid,
        previous=[],
        now=NOW,
    )
    conds = {c["type"]: c for c in result["conditions"]}
    assert (
        conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == "ConfigMapMissing"
    )
    assert conds["Ready"]["status"] == "False"
    empty = set_status(
        generation=1,
        selected=[],
        observations={},
        desired=resolve(SPEC, "ns", 1, {}),
        invalid=None,
        previous=[],
        now=NOW,
    )
    assert {c["type"]: c["reason"] for c in empty["conditions"]}["Ready"] == "NoNodes"


def test_heartbeats_alone_are_not_a_change() -> None:
    desired = resolve(SPEC, "ns", 1, {})
    a, b, _ = nodes()
    obs = {n: Observation(n, True, warm_status(desired, [PromptState.WARM])) for n in "ab"}
    first = set_status(
        generation=1,
        selected=[a, b],
        observations=obs,
        desired=desired,
        invalid=None,
        previous=[],
        now=NOW,
    )
    again = set_status(
        generation=1,
        selected=[a, b],
        observations=obs,
        desired=desired,
        invalid=None,
        previous=first["conditions"],
        now=LATER,
    )
    assert first != again and not changed(first, again)  # only lastSync moved
    obs["b"] = Observation("b", False, None, "down")
    later = set_status(
        generation=1,
        selected=[a, b],
        observations=obs,
        desired=desired,
        invalid=None,
        previous=first["conditions"],
        now=LATER,
    )
    assert changed(first, later)


def test_status_entries_hold_no_nulls() -> None:
    """The API server prunes nulls; a status with them never reads back as written."""
    node = Node("a", "http://a", {})
    warm = WarmSetStatus(
        namespace="ns", name="s", generation=1, uid="u", source_hash="h", content_hash="c",
        concurrency=2, pin=True, prompts=[], warm=0, total=0, updated_at=0.0,
    )  # fmt: skip
    for seen in [Observation("a", True, warm), Observation("a", True, None), None]:
        status = set_status(
            generation=1, selected=[node], observations={"a": seen} if seen else {},
            desired=None, invalid=None, previous=[], now=NOW,
        )  # fmt: skip
        assert all(v is not None for entry in status["nodes"] for v in entry.values())


def test_a_set_over_the_size_limit_is_refused_with_a_reason() -> None:
    """The CRD bounds a set's text; ConfigMaps can still grow it past the bound."""
    big = "- {role: system, content: '" + "x" * 300_000 + "'}\n"
    spec = {
        "prompts": [
            {"name": f"p{i}", "messagesFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}
            for i in range(2)
        ]
    }
    with pytest.raises(InvalidSpec) as caught:
        resolve(spec, "ns", 1, {("ns", "cm"): {"k": big}})
    assert caught.value.reason == "TooLarge" and "524288" in caught.value.message


def test_the_log_line_says_where_a_push_failed() -> None:
    node = Node("d1", "http://d1", {})
    desired = resolve(SPEC, "ns", 1, {})
    line = describe(SetKey("ns", "s"), [Push(node, desired)], [], {"d1": "422 too long"})
    assert "pushed to" not in line and "push failed on d1 (422 too long)" in line


# -- warm prompts in the agent APIs' shapes ------------------------------------------------


def test_agent_shapes_pass_through_unchanged_inline_and_from_configmaps() -> None:
    """`anthropic` and `responses` prompts reach the daemon as written (the push body
    equals what `warmfleet warm-prompts capture` wrote); `anthropicFrom` and
    `responsesFrom` read the same object from a ConfigMap key, which may use content
    blocks and any input items (a structural schema takes strings only)."""
    from support.agents import claude_code, codex
    from warmfleet_common.agent_apis.anthropic import MessagesPrefix
    from warmfleet_common.agent_apis.prefix import warm_prompt

    claude = warm_prompt("anthropic", claude_code().body, "claude-code")
    codex_prompt = warm_prompt("responses", codex().body, "codex")
    entries = [p.model_dump(mode="json", exclude_none=True) for p in (claude, codex_prompt)]
    inline = resolve({"prompts": entries}, "ns", 1, {})
    assert inline.prompts == [claude, codex_prompt]

    blocks = {
        "system": [{"type": "text", "text": "You review Go code."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Example: review x := 1"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "lint", "input": {}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        ],
        "tools": [{"name": "lint", "input_schema": {"type": "object"}}],
    }
    spec = {
        "prompts": [
            {"name": "a", "anthropicFrom": {"configMapKeyRef": {"name": "agents", "key": "a"}}},
            {"name": "r", "responsesFrom": {"configMapKeyRef": {"name": "agents", "key": "r"}}},
        ]
    }
    maps = {
        ("ns", "agents"): {
            "a": json.dumps(blocks),
            "r": yaml.safe_dump(entries[1]["responses"]),  # YAML works too
        }
    }
    resolved = resolve(spec, "ns", 1, maps)
    assert resolved.prompts[0].anthropic == MessagesPrefix.model_validate(blocks)
    assert resolved.prompts[1].responses == codex_prompt.responses
    assert referenced_configmaps(spec) == {"agents"}
    changed = {("ns", "agents"): {**maps[("ns", "agents")], "a": json.dumps({"system": "new"})}}
    assert resolve(spec, "ns", 1, changed).source_hash != resolved.source_hash


@pytest.mark.parametrize(
    ("value", "reason", "words"),
    [
        ("[{role: system, content: x}]", "ConfigMapInvalid", "must hold the anthropic prompt"),
        ("{system: [unclosed", "ConfigMapInvalid", "agents/k"),
        ("{system: x, max_tokens: 10}", "InvalidSpec", "max_tokens"),
        ("{}", "InvalidSpec", "at least one of system"),
    ],
)
def test_an_unusable_agent_prompt_from_a_configmap_is_explained(
    value: str, reason: str, words: str
) -> None:
    spec = {
        "prompts": [
            {"name": "a", "anthropicFrom": {"configMapKeyRef": {"name": "agents", "key": "k"}}}
        ]
    }
    with pytest.raises(InvalidSpec) as caught:
        resolve(spec, "ns", 1, {("ns", "agents"): {"k": value}})
    assert caught.value.reason == reason and words in caught.value.message


def test_agent_prompts_count_toward_the_size_limit() -> None:
    """As the CRD's rule counts them: system prompts, instructions, contents, the tool
    descriptions (a namespace's too)."""
    big = "x" * 200_000
    prompts = [
        {"name": "a", "anthropic": {"system": big, "messages": [{"role": "user", "content": big}]}},
        {
            "name": "r",
            "responses": {
                "instructions": "x",
                "tools": [
                    {
                        "type": "namespace",
                        "name": "ns",
                        "tools": [{"type": "function", "name": "f", "description": big}],
                    }
                ],
            },
        },
    ]
    with pytest.raises(InvalidSpec) as caught:
        resolve({"prompts": prompts}, "ns", 1, {})
    assert caught.value.reason == "TooLarge" and "600001" in caught.value.message
