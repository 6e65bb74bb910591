"""What the engine serves: its base model and LoRA adapters, listed by `/v1/models`.

A router learns which engine serves which adapter from this list, and the
list may change at runtime (`set_adapters`), as vLLM loads and unloads them.
"""

from __future__ import annotations

import time

from headcount.sim.engine.wire import json_bytes

__all__ = ["ModelCatalog"]


class ModelCatalog:
    """The base model and its adapters: the `/v1/models` body and the names `model` may take."""

    def __init__(self, model: str, max_model_len: int, adapters: list[str]) -> None:
        self._model = model
        self._max_model_len = max_model_len
        self._created = int(time.time())
        self.served = frozenset({model})
        self.body = b""
        self.set_adapters(adapters)

    def set_adapters(self, adapters: list[str]) -> None:
        """Replace the LoRA adapters listed by `/v1/models` and accepted as `model`."""
        model = self._model
        cards = [self._model_card(model, root=model, parent=None)]
        cards += [self._model_card(a, root=f"/adapters/{a}", parent=model) for a in adapters]
        self.body = json_bytes({"object": "list", "data": cards})
        self.served = frozenset({model, *adapters})

    def _model_card(self, model_id: str, root: str, parent: str | None) -> dict[str, object]:
        return {
            "id": model_id,
            "object": "model",
            "created": self._created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": self._max_model_len,
        }
