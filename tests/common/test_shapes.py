"""The API shapes' registry: every place that names a shape reads the same entries, and
the CRD (crds/, the source of truth for WarmPromptSets) has each entry's fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import ValidationError

from warmfleet_common.agent_apis.shapes import SHAPES, ApiName
from warmfleet_common.contract import WarmPrompt

CRD = Path(__file__).parents[2] / "crds" / "warmpromptsets.warmfleet.io.yaml"

# One prompt in each shape, the smallest each takes.
PROMPTS: dict[ApiName, dict[str, Any]] = {
    "chat": {"messages": [{"role": "system", "content": "You review code."}]},
    "anthropic": {"anthropic": {"system": "You review code."}},
    "responses": {"responses": {"instructions": "You review code."}},
}


def test_the_registry_names_each_shape_once() -> None:
    assert set(SHAPES) == set(get_args(ApiName)) == set(PROMPTS)
    assert all(shape.name == name for name, shape in SHAPES.items())
    for attribute in ("prompt_field", "configmap_field", "path"):
        values = [getattr(s, attribute) for s in SHAPES.values()]
        assert len(set(values)) == len(values), attribute


@pytest.mark.parametrize("api", list(SHAPES))
def test_a_warm_prompt_says_its_shape_from_the_field_that_holds_it(api: ApiName) -> None:
    assert SHAPES[api].prompt_field in WarmPrompt.model_fields
    assert WarmPrompt.model_validate({"name": "p", **PROMPTS[api]}).api == api


def test_a_warm_prompt_in_no_shape_or_two_names_every_shape() -> None:
    expected = (
        "give exactly one of messages (chat completions), anthropic (the Messages API) and "
        "responses (the Responses API); got "
    )
    with pytest.raises(ValidationError, match=r"got none") as none:
        WarmPrompt.model_validate({"name": "p"})
    assert expected + "none" in str(none.value)
    with pytest.raises(ValidationError) as two:
        WarmPrompt.model_validate({"name": "p", **PROMPTS["chat"], **PROMPTS["anthropic"]})
    assert expected + "messages, anthropic" in str(two.value)


def test_the_crd_has_each_shapes_fields() -> None:
    crd = yaml.safe_load(CRD.read_text())
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    prompt = spec["properties"]["prompts"]["items"]
    one_of = prompt["x-kubernetes-validations"][0]["rule"]
    for shape in SHAPES.values():
        assert {shape.prompt_field, shape.configmap_field} <= set(prompt["properties"])
        assert f"has(self.{shape.prompt_field})" in one_of
        assert f"has(self.{shape.configmap_field})" in one_of
