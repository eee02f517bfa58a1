"""The static parts of each agent's requests, per version and developer: Claude Code's
system blocks, tools and environment message, Codex's developer messages, tools and
environment context, and each CLI's headers. Laid out as this repository recorded the
real CLIs (tests/support/data/), sized as it measured them (`population`), filled with
deterministic pseudo-text (`text`). Built once per (agent, version, developer) and
shared by every request of every session that uses it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from warmfleet_cli.sim.population import AGENTS, AgentShape
from warmfleet_cli.sim.text import chars, text

CLAUDE_TOOLS = [
    "Agent",
    "Bash",
    "Edit",
    "Glob",
    "Grep",
    "NotebookEdit",
    "Read",
    "Skill",
    "TodoWrite",
    "ToolSearch",
    "WebFetch",
    "Write",
]
CODEX_TOOLS = [
    "exec_command",
    "write_stdin",
    "apply_patch",
    "update_plan",
    "view_image",
    "list_mcp_resources",
    "read_mcp_resource",
    "request_user_input",
    "update_goal",
]
CODEX_NAMESPACE = ("multi_agent_v1", ("spawn_agent", "close_agent", "resume_agent"))
ADDED_TOOL = {"claude-code": "Monitor", "codex": "search_files"}
CHANGED_TOOL = 3  # the upgrade rewrites this tool's description (the ones before it stay)
ANTHROPIC_BETA = (
    "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
    "per-turn-control-2026-07-01,mid-conversation-tool-changes-2026-07-01,"
    "thinking-token-count-2026-05-13,advanced-tool-use-2025-11-20,effort-2025-11-24"
)
MEMORY_AT_TOKENS = 790  # where Claude Code 2.1 names its memory directory (README.md)


@dataclass(frozen=True)
class Layout:
    """What every request of one agent version from one developer starts with."""

    agent: str
    version: str
    system: tuple[str, ...]  # Claude Code: system text blocks; Codex: developer messages
    tools: tuple[dict[str, Any], ...]
    environment: str  # Claude Code: system message after the words; Codex: user message
    reminder: str  # Claude Code: the system-reminder block before the user's words
    cwd: str
    device: str  # Claude Code's device_id / Codex's installation_id


def home(developer: int) -> str:
    return f"/Users/dev{developer:03d}"


def _versioned_text(shape: AgentShape, version: str, part: str, n_chars: int) -> str:
    """`part`'s text: the day's version's, or the upgrade's, which keeps its first half."""
    base = text(f"{shape.name}/{shape.version}/{part}", n_chars)
    if version == shape.version:
        return base
    half = n_chars // 2
    return base[:half] + text(f"{shape.name}/{version}/{part}", n_chars - half)


def _tool_names(shape: AgentShape, version: str) -> list[str]:
    names = list(CLAUDE_TOOLS if shape.name == "claude-code" else CODEX_TOOLS)
    return names + ([ADDED_TOOL[shape.name]] if version != shape.version else [])


def _claude_tool(shape: AgentShape, version: str, index: int, name: str, size: int) -> Any:
    changed = version != shape.version and index in (CHANGED_TOOL, len(CLAUDE_TOOLS))
    key = f"{shape.name}/{version if changed else shape.version}/tool/{name}"
    params = [f"{name.lower()}_{p}" for p in ("target", "mode", "limit")]
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            p: {"description": text(f"{key}/{p}", 90), "type": "string"} for p in params
        },
        "required": params[:1],
        "additionalProperties": False,
    }
    tool = {"name": name, "description": "", "input_schema": schema}
    tool["description"] = text(key, max(40, size - len(json.dumps(tool))))
    return tool


def _codex_function(shape: AgentShape, version: str, index: int, name: str, size: int) -> Any:
    changed = version != shape.version and index in (CHANGED_TOOL, len(CODEX_TOOLS))
    key = f"{shape.name}/{version if changed else shape.version}/tool/{name}"
    params = [p for p in ("cmd", "workdir", "timeout_ms")]
    tool = {
        "type": "function",
        "name": name,
        "description": "",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {
                p: {"type": "string", "description": text(f"{key}/{p}", 80)} for p in params
            },
            "required": params[:1],
            "additionalProperties": False,
        },
    }
    tool["description"] = text(key, max(40, size - len(json.dumps(tool))))
    return tool


@lru_cache(maxsize=4096)
def layout(agent: str, version: str, developer: int, memory: bool, date: str) -> Layout:
    """The static parts for `developer`'s sessions of `agent` at `version`. `memory`:
    Claude Code names the developer's memory directory in its system prompt (as 2.1
    does unless CLAUDE_CODE_DISABLE_AUTO_MEMORY=1), so its prompt differs per developer."""
    shape = AGENTS[agent]
    cwd = f"{home(developer)}/src/app"
    device = text(f"device/{developer}", 64, code_share=0).encode().hex()[:64]
    names = _tool_names(shape, version)
    per_tool = chars(shape.tools_tokens) // shape.tool_count
    if agent == "claude-code":
        body = _versioned_text(shape, version, "system", chars(shape.system_tokens) - 140)
        if memory:
            at = chars(MEMORY_AT_TOKENS)
            line = f"\nYour memory directory is {home(developer)}/.claude/projects/app/memory/\n"
            body = body[:at] + line + body[at:]
        system: tuple[str, ...] = (
            "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
            body,
        )
        tools = [_claude_tool(shape, version, i, n, per_tool) for i, n in enumerate(names)]
        tools.append(
            {
                "name": "DeferredToolPlaceholder",
                "description": "Reserved placeholder that keeps deferred tool loading "
                "active; never call this tool.",
                "input_schema": {"type": "object", "properties": {}},
                "defer_loading": True,
            }
        )
        head = (
            "# Environment\nYou have been invoked in the following environment: \n"
            f" - Primary working directory: {cwd}\n - Is a git repository: true\n"
            " - Platform: darwin\n - Shell: zsh\n - OS Version: Darwin 24.5.0\n"
            f"\nToday's date is {date}.\n\n"
        )
        pad = chars(shape.environment_tokens) - len(head)
        environment = head + text(f"{agent}/{version}/environment", pad)
        reminder = "<system-reminder>\n" + text(
            f"{agent}/{version}/reminder", shape.reminder_chars - 38
        )
        reminder += "\n</system-reminder>\n"
    else:
        instructions = chars(shape.system_tokens)
        system = (
            _versioned_text(shape, version, "instructions", instructions * 3 // 4),
            "<skills_instructions>\n"
            + _versioned_text(shape, version, "skills", instructions // 8)
            + "\n</skills_instructions>",
            "<permissions instructions>\n"
            + _versioned_text(shape, version, "permissions", instructions // 8)
            + "\n</permissions instructions>",
        )
        namespace, functions = CODEX_NAMESPACE
        tools = [_codex_function(shape, version, i, n, per_tool) for i, n in enumerate(names)]
        tools.append(
            {
                "type": "namespace",
                "name": namespace,
                "description": "Tools for spawning and managing sub-agents.",
                "tools": [
                    _codex_function(shape, shape.version, -1, f, per_tool) for f in functions
                ],
            }
        )
        tools.append({"type": "web_search", "external_web_access": False})
        environment = (
            f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>zsh</shell>\n"
            f"  <current_date>{date}</current_date>\n  <timezone>Europe/Berlin</timezone>\n"
            f"  <filesystem><workspace_roots><root>{cwd}</root></workspace_roots>"
            '<permission_profile type="managed"><file_system type="restricted"><entry '
            'access="write"><special>:workspace</special></entry></file_system>'
            "</permission_profile></filesystem>\n</environment_context>"
        )
        reminder = ""
    return Layout(agent, version, system, tuple(tools), environment, reminder, cwd, device)


def claude_code_headers(version: str, session: str) -> dict[str, str]:
    """As Claude Code 2.1.332 sends them (tests/support/data/claude-code-2.1.332.json)."""
    return {
        "Content-Type": "application/json",
        "User-Agent": f"claude-cli/{version} (external, cli)",
        "X-Claude-Code-Session-Id": session,
        "anthropic-beta": ANTHROPIC_BETA,
        "anthropic-version": "2023-06-01",
        "x-api-key": "sk-warmfleet-sim",
        "x-app": "cli",
    }


def codex_headers(version: str, session: str) -> dict[str, str]:
    """As Codex 0.171.0 sends them (tests/support/data/codex-0.171.0.json)."""
    return {
        "session-id": session,
        "thread-id": session,
        "accept": "text/event-stream",
        "content-type": "application/json",
        "authorization": "Bearer warmfleet-sim",
        "originator": "codex_exec",
        "user-agent": f"codex_exec/{version} (Mac OS 15.5.0; arm64) (codex_exec; {version})",
    }
