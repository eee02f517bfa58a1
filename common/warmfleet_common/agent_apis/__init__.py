"""The APIs coding agents speak, as request shapes and their translation to the chat
messages and tools every prompt is rendered from: Anthropic's Messages API (Claude
Code) and OpenAI's Responses API (Codex). Pure pydantic, no mlx or web framework, so
the daemon's routes, warm prompts and a router render them the same way. `shapes` is
the registry of API shapes (chat's too) that every component names them by."""
