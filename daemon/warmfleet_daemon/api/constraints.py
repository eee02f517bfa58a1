"""What a request asks of the output beyond sampling, whatever its API: a grammar for a
forced tool call or for JSON output, and stop strings from the tool settings.

Every API's path says it the same way (`OutputRules`: the chat template's function tools
and `ChatOptions`, which the Anthropic and Responses requests are translated to), so one
code path builds and checks the grammars for all of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from warmfleet_common.agent_apis.chat import ChatOptions
from warmfleet_daemon.api.channels import writes_channels
from warmfleet_daemon.api.errors import APIError
from warmfleet_daemon.api.tool_calls import forced_call_grammar, tool_format
from warmfleet_daemon.engine.finite_schema import no_finite_instance
from warmfleet_daemon.engine.grammar import GrammarError, json_schema_grammar, lark_grammar
from warmfleet_daemon.runtime.assembly import Ready


@dataclass(frozen=True)
class OutputRules:
    """A request's function tools (OpenAI's shape, as the chat template renders them),
    how they may be called and whether the output is JSON (`options`), and chat
    completions' `ignore_eos` (which no grammar can be combined with)."""

    tools: list[dict[str, Any]] | None
    options: ChatOptions
    ignore_eos: bool = False

    @property
    def tool_choice(self) -> str:
        """`none`, `auto`, `required`, or `named` (a function: `named_function`); OpenAI's
        default: `auto` when there are tools."""
        choice = self.options.tool_choice
        if choice is None:
            return "auto" if self.tools else "none"
        return "named" if isinstance(choice, dict) else choice

    @property
    def named_function(self) -> str | None:
        choice = self.options.tool_choice
        return str(choice["function"]["name"]) if isinstance(choice, dict) else None

    @property
    def json_output(self) -> bool:
        return self.options.json_schema is not None or self.options.json_object


def output_constraints(ready: Ready, rules: OutputRules) -> tuple[str | None, tuple[str, ...]]:
    """The grammar the output must follow (a forced tool call or `response_format`) and
    stop strings the tool settings add. Raises a 400 for combinations that cannot be
    honoured; compiles the grammar (llguidance) so a bad schema is a 400, not a failed
    generation."""
    choice, named = rules.tool_choice, rules.named_function
    if choice != "none" and not rules.tools:
        raise APIError(400, "tool_choice needs a list of tools", param="tool_choice")
    fmt = tool_format(ready.model.tokenizer)
    forced = choice in ("required", "named")
    json_output = rules.json_output
    grammar, param = None, None
    if forced:
        if json_output:
            raise APIError(
                400,
                "response_format cannot be combined with a forced tool call (tool_choice)",
                param="response_format",
            )
        if writes_channels(ready.model.tokenizer):
            raise APIError(
                400,
                "this model writes its tool calls in harmony channels, which cannot be "
                'forced; use tool_choice "auto"',
                param="tool_choice",
            )
        if not fmt.json_calls:
            raise APIError(
                400,
                f"this model's tool-call format ({fmt.start}...) cannot be forced; "
                'use tool_choice "auto"',
                param="tool_choice",
            )
        functions = [t["function"] for t in rules.tools or []]
        if named is not None:
            functions = [f for f in functions if f["name"] == named]
            if not functions:
                raise APIError(400, f"no tool named {named!r}", param="tool_choice")
        for f in functions:
            endless = no_finite_instance(f.get("parameters"))
            if endless is not None:
                message = f"tool {f['name']!r}: its parameters cannot be enforced: {endless}"
                raise APIError(400, message, param="tools")
        parallel = rules.options.parallel_tool_calls is not False and named is None
        grammar = lark_grammar(forced_call_grammar(fmt, functions, parallel=parallel))
        param = "tool_choice"
    elif json_output:
        schema = rules.options.json_schema
        if schema is None:  # any JSON object
            schema = {"type": "object"}
        param = "response_format"
        try:
            grammar = json_schema_grammar(schema)
        except GrammarError as exc:
            raise APIError(400, f"invalid JSON schema: {exc}", param=param) from exc
    if grammar is not None:
        if rules.ignore_eos:
            raise APIError(400, f"ignore_eos cannot be combined with {param}", param="ignore_eos")
        try:
            ready.engine.grammars.check(grammar)
        except GrammarError as exc:
            raise APIError(400, f"{param} cannot be enforced: {exc}", param=param) from exc
    # Without parallel calls the first call's closing tag ends the completion.
    one_call = choice == "auto" and rules.options.parallel_tool_calls is False
    return grammar, (fmt.end,) if one_call else ()
