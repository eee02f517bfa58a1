"""What a chat request asks of the output beyond sampling: a grammar for a forced tool
call or for `response_format`, and stop strings from the tool settings."""

from __future__ import annotations

from warmfleet_daemon.api.channels import writes_channels
from warmfleet_daemon.api.errors import APIError
from warmfleet_daemon.api.schemas import ChatCompletionRequest, NamedToolChoice
from warmfleet_daemon.api.tool_calls import forced_call_grammar, tool_format
from warmfleet_daemon.engine.finite_schema import no_finite_instance
from warmfleet_daemon.engine.grammar import GrammarError, json_schema_grammar, lark_grammar
from warmfleet_daemon.runtime.assembly import Ready


def tool_choice(body: ChatCompletionRequest) -> str | NamedToolChoice:
    """`none`, `auto`, `required` or a named function; OpenAI's default: `auto` when
    there are tools."""
    if body.tool_choice is None:
        return "auto" if body.tools else "none"
    return body.tool_choice


def output_constraints(
    ready: Ready, body: ChatCompletionRequest
) -> tuple[str | None, tuple[str, ...]]:
    """The grammar the output must follow (a forced tool call or `response_format`) and
    stop strings the tool settings add. Raises a 400 for combinations that cannot be
    honoured; compiles the grammar (llguidance) so a bad schema is a 400, not a failed
    generation."""
    choice = tool_choice(body)
    if choice != "none" and not body.tools:
        raise APIError(400, "tool_choice needs a list of tools", param="tool_choice")
    fmt = tool_format(ready.model.tokenizer)
    forced = choice == "required" or isinstance(choice, NamedToolChoice)
    json_output = body.response_format is not None and body.response_format.type != "text"
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
        functions = [t.function.model_dump(exclude_none=True) for t in body.tools or []]
        if isinstance(choice, NamedToolChoice):
            functions = [f for f in functions if f["name"] == choice.function.name]
            if not functions:
                raise APIError(400, f"no tool named {choice.function.name!r}", param="tool_choice")
        for f in functions:
            endless = no_finite_instance(f.get("parameters"))
            if endless is not None:
                message = f"tool {f['name']!r}: its parameters cannot be enforced: {endless}"
                raise APIError(400, message, param="tools")
        parallel = body.parallel_tool_calls is not False and not isinstance(choice, NamedToolChoice)
        grammar = lark_grammar(forced_call_grammar(fmt, functions, parallel=parallel))
        param = "tool_choice"
    elif json_output:
        assert body.response_format is not None
        schema = (
            body.response_format.json_schema.schema_
            if body.response_format.json_schema is not None
            and body.response_format.type == "json_schema"
            else {"type": "object"}
        )
        param = "response_format"
        try:
            grammar = json_schema_grammar(schema)
        except GrammarError as exc:
            raise APIError(400, f"invalid JSON schema: {exc}", param=param) from exc
    if grammar is not None:
        if body.ignore_eos:
            raise APIError(400, f"ignore_eos cannot be combined with {param}", param="ignore_eos")
        try:
            ready.engine.grammars.check(grammar)
        except GrammarError as exc:
            raise APIError(400, f"{param} cannot be enforced: {exc}", param=param) from exc
    # Without parallel calls the first call's closing tag ends the completion.
    one_call = choice == "auto" and body.parallel_tool_calls is False
    return grammar, (fmt.end,) if one_call else ()
