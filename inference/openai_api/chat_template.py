"""Chat messages → one prompt string, with the model's own chat template when it has one.

The web process never loads transformers (import contract), so the template is read from the
model folder's `chat_template.jinja` or `tokenizer_config.json` and rendered with Jinja2 the
way transformers renders it (trim_blocks, lstrip_blocks, a sandbox, `raise_exception`,
`bos_token`/`eos_token`, `add_generation_prompt=True`).

Models without a template (the tiny test LLM, base models) get the documented fallback: one
"role: content" line per message, then "assistant:" for the model to continue.
"""

from __future__ import annotations

import json
from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from inference.config.model_files import model_folder


class ChatTemplateError(ValueError):
    """The model's chat template refused the messages (raise_exception) or is broken."""


def render_chat(model_ref: str, messages: list[dict[str, str]]) -> str:
    template = load_chat_template(model_ref)
    if template is None:
        return fallback_prompt(messages)
    source, special_tokens = template
    try:
        return (
            _environment()
            .from_string(source)
            .render(messages=messages, add_generation_prompt=True, **special_tokens)
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(str(exc)) from exc


def fallback_prompt(messages: list[dict[str, str]]) -> str:
    lines = [f"{message['role']}: {message['content']}" for message in messages]
    return "\n".join([*lines, "assistant:"])


@lru_cache(maxsize=64)
def load_chat_template(model_ref: str) -> tuple[str, dict[str, str]] | None:
    """(template source, {bos_token, eos_token}) or None when the model has no template."""
    try:
        folder = model_folder(model_ref)
    except ImportError:
        return None
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    jinja_path = folder / "chat_template.jinja"
    source = jinja_path.read_text() if jinja_path.is_file() else config.get("chat_template")
    if isinstance(source, list):  # named templates: [{"name": "default", "template": ...}]
        named = {item.get("name"): item.get("template") for item in source}
        source = named.get("default")
    if not source:
        return None
    return source, {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token")}


def _token_text(token: object) -> str:
    if isinstance(token, dict):  # saved as an AddedToken: {"content": "<s>", ...}
        return str(token.get("content", ""))
    return str(token or "")


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.globals["raise_exception"] = _raise_exception
    environment.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent)
    return environment
