"""The warm sets a platform team would have captured before a trace's day: for each agent,
the static head (`warm-prompts capture`'s cut: system, tools, leading messages) of the
version its developers run when the day starts, taken from the first session's first
request. An upgrade later in the day brings a head nobody captured: its sessions start
cold, as they would on a real fleet whose warm set was written by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from warmfleet_cli.sim.bodies import BodyOptions, SessionBodies
from warmfleet_cli.sim.trace import Record
from warmfleet_common.agent_apis.prefix import warm_prompt
from warmfleet_common.agent_apis.shapes import ApiName
from warmfleet_common.crd import API_VERSION

API_OF_PATH: dict[str, ApiName] = {
    "/v1/messages": "anthropic",
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
}
SET_NAME = "trace-agents"


def captured_prompts(
    header: dict[str, Any], records: Iterable[Record], model: str = "default"
) -> list[dict[str, Any]]:
    """One warm prompt per agent: the head of the version in use at the trace's start
    (before its first `agent-upgrade` event), named `{agent}-{version}`."""
    options = BodyOptions.of(header, model)
    upgraded: set[str] = set()
    prompts: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.get("event") == "agent-upgrade":
            upgraded.add(str(record["agent"]))
            continue
        agent = record.get("agent")
        if "session" not in record or record["turn"] != 0 or agent in prompts:
            continue
        if agent in upgraded:
            continue  # the day started on the older version, whose sessions came first
        request = SessionBodies(options).request(record)
        api = API_OF_PATH[request.path.split("?")[0]]
        name = f"{agent}-{record['version']}".replace(".", "-").lower()
        prompt = warm_prompt(api, request.body, name)
        prompts[str(agent)] = prompt.model_dump(mode="json", exclude_none=True)
    return list(prompts.values())


def warm_prompt_set(prompts: list[dict[str, Any]], fleet_label: dict[str, str]) -> dict[str, Any]:
    """The WarmPromptSet holding `prompts`, for every node with `fleet_label`."""
    return {
        "apiVersion": API_VERSION,
        "kind": "WarmPromptSet",
        "metadata": {"name": SET_NAME, "namespace": "default"},
        "spec": {"nodeSelector": {"matchLabels": fleet_label}, "prompts": prompts},
    }
