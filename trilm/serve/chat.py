"""Chat prompts: the model's own chat template when its tokenizer carries one, else trilm's plain format.

A model imported with a Hugging Face tokenizer (SmolLM2-Instruct, Llama-3-Instruct, …) was fine-tuned on its
chat template: the prompt is that template rendered by transformers (``apply_chat_template`` with the
generation prompt), and the reply ends at the model's EOS (``<|im_end|>``, ``<|eot_id|>``…), so no stop
strings are added (:func:`chat_prompt`).

The plain-text chat format of trilm's base models:

trilm models are base language models with a SentencePiece tokenizer and no special chat tokens, so a
conversation is rendered as plain text that such a model continues naturally::

    System: You are terse.

    User: What is two plus two?

    Assistant: Four.

    User: And three plus three?

    Assistant:

Every message is ``"<Role>: <content>"`` followed by a blank line, roles capitalised (``developer`` is shown
as ``System``); list contents join their text parts with newlines. The prompt ends with ``"Assistant:"``
(no trailing space: a SentencePiece model writes the space itself as part of its first word), and the reply
stops at the next line that starts another turn (:data:`CHAT_STOP`), at EOS, or at ``max_tokens``. The
leading space of the reply is removed.
"""

from __future__ import annotations

ROLE_NAMES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
CHAT_STOP = ("\nUser:", "\nSystem:", "\nAssistant:")


def render_chat(messages: list[tuple[str, str]]) -> str:
    """The prompt for ``messages`` as (role, text) pairs, ending where the assistant's reply begins."""
    if not messages:
        raise ValueError("messages: must not be empty")
    parts = []
    for i, (role, text) in enumerate(messages):
        if role not in ROLE_NAMES:
            raise ValueError(f"messages[{i}].role: must be one of {sorted(ROLE_NAMES)}, got {role!r}")
        parts.append(f"{ROLE_NAMES[role]}: {text}\n\n")
    return "".join(parts) + "Assistant:"


def chat_prompt(tokenizer, messages: list[tuple[str, str]]) -> tuple[str, tuple[str, ...]]:
    """(prompt text, stop strings) for ``messages``: the tokenizer's chat template if it has one."""
    if getattr(tokenizer, "chat_template", None):
        for i, (role, _) in enumerate(messages):
            if role not in ROLE_NAMES:
                raise ValueError(f"messages[{i}].role: must be one of {sorted(ROLE_NAMES)}, got {role!r}")
        if not messages:
            raise ValueError("messages: must not be empty")
        turns = [{"role": "system" if r == "developer" else r, "content": t} for r, t in messages]
        try:
            return tokenizer.render_chat(turns), ()
        except Exception as exc:  # a template may raise for conversations it does not accept
            raise ValueError(f"messages: the model's chat template refused them ({exc})") from None
    return render_chat(messages), CHAT_STOP


class ReplyText:
    """Strips the leading whitespace of a streamed reply (the space after ``Assistant:``)."""

    def __init__(self) -> None:
        self.started = False

    def __call__(self, delta: str) -> str:
        if self.started:
            return delta
        delta = delta.lstrip()
        self.started = bool(delta)
        return delta
