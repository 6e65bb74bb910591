"""Token ids for chats and prompts, computed as the engine computes them, for simulator and router.

A prefix cache is keyed by token ids, so predicting what an engine holds
starts with the exact ids it will compute: the model's chat template rendered
as transformers renders it, then its tokenizer (`tokenizer.json`). With no
model files, a documented built-in tokenizer and ChatML template stand in.

    tokenizer = load_tokenizer("/models/qwen3")  # or None: the built-in one
    ids = tokenizer.chat_ids([{"role": "user", "content": "hi"}])
"""

from headcount.tokens.chat import ChatTokenizer
from headcount.tokens.errors import ChatTemplateError, TokenizerError
from headcount.tokens.loader import builtin_tokenizer, load_tokenizer
from headcount.tokens.requests import PromptKind, RequestTokensError, prompt_ids

__all__ = [
    "ChatTemplateError",
    "ChatTokenizer",
    "PromptKind",
    "RequestTokensError",
    "TokenizerError",
    "builtin_tokenizer",
    "load_tokenizer",
    "prompt_ids",
]
