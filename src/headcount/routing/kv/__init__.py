"""Routing on the engines' own KV caches: the `kv-aware` policy and a request's prompt for it.

`policy.py` decides (a pure cost over predicted cached tokens and load),
`request.py` carries one request's prompt, predictions and route receipt,
`prompts.py` gets the prompt's token ids: the router's tokenizer, or an
engine's `POST /tokenize`.
"""

from headcount.routing.kv.policy import KvAware, KvRouting, choose, ttft_cost
from headcount.routing.kv.request import KvIndexView, KvRequest

__all__ = ["KvAware", "KvIndexView", "KvRequest", "KvRouting", "choose", "ttft_cost"]
