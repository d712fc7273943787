"""What a worker and its engines exchange, importable without torch or transformers: a worker
that runs no model (the I/O and control workers, a no-op service's) never loads them."""

from __future__ import annotations

from dataclasses import dataclass

# In a result: the generation is unfinished, here is its state; in a payload: continue it.
# The state: {"prompt_ids", "generated_ids", "streamed"} (the text already streamed).
RESUME = "resume"


class RequestTooLarge(ValueError):
    """The request needs more KV cache than this model's cache holds, even alone."""

    def __init__(self, needed_tokens: int, limit_tokens: int):
        self.needed_tokens = needed_tokens
        self.limit_tokens = limit_tokens
        super().__init__(
            f"prompt + max_tokens = {needed_tokens} tokens is more than this model's KV cache "
            f"holds for one request ({limit_tokens} tokens)"
        )


@dataclass(frozen=True)
class Finished:
    """A request's final result (tokens include a final EOS, as generate() returns them)."""

    request_id: str
    tokens: list[int]
    finish_reason: str  # "stop" (an EOS or a stop string), "length", "cancelled", "error"
    prompt_tokens: int
    max_new_tokens: int
    error: str | None = None
    stop_text: str | None = None  # the stop string that ended it
    admitted_step: int | None = None  # the decode step that first ran it
    first_token_step: int | None = None
    finished_step: int | None = None
    evictions: int = 0
    restarts: int = 0
