"""What fails on the way to token ids: a tokenizer that cannot load, a chat that cannot render.

Callers answer a request whose chat the template refuses with a 400, and stop
at startup on a tokenizer directory that cannot be read.
"""

from __future__ import annotations

__all__ = ["ChatTemplateError", "TokenizerError"]


class TokenizerError(Exception):
    """A tokenizer directory that cannot be loaded, or a request that cannot be tokenized."""


class ChatTemplateError(TokenizerError):
    """The chat template refused the chat (or does not compile); vLLM answers 400."""
