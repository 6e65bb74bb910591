"""How long prompts take: one prefill pipeline per engine, shared first come first served.

The engine's timing model, with `--kv-blocks`:

- A request waits, first come first served, for a slot (`--max-running`) and
  for the KV blocks it needs.
- Admitted, its uncached prompt tokens join the engine's prefill pipeline,
  which processes `--prefill-tokens-per-s` tokens a second in admission order.
  Requests prefilling at once share it, so a long uncached prompt delays every
  request admitted after it, as chunked prefill does on a GPU; cached tokens
  cost nothing.
- Every output token, the first included, then takes `--token-delay`.

So time to first token = wait for a slot and blocks + wait for the pipeline +
uncached prompt tokens / prefill rate + token delay.

Defaults, for an 8B model (Llama-3-8B) on one H100: 16,000 prefill tokens a
second; blocks of 16 tokens, of which such a GPU holds about 28,000 at 0.9
memory utilisation (128 KiB of KV per token); about 0.01 s per output token at
small batch (`--token-delay 0.01`; the default 0 keeps tests fast).

A request admitted but whose prefill has not started counts as waiting in the
metrics, as a request vLLM has not scheduled yet does (`EngineState.load`).
"""

from __future__ import annotations

from headcount.clock import Clock

__all__ = ["PrefillPipeline"]


class PrefillPipeline:
    """Prompt tokens in, first come first served, at `tokens_per_s`."""

    def __init__(self, tokens_per_s: float, clock: Clock) -> None:
        self.tokens_per_s = tokens_per_s
        self._clock = clock
        self._free_at = 0.0

    def admit(self, tokens: int) -> tuple[float, float]:
        """Queue `tokens` prompt tokens; when their prefill starts and when it is done."""
        start = max(self._clock(), self._free_at)
        self._free_at = start + tokens / self.tokens_per_s
        return start, self._free_at

    def backlog(self) -> float:
        """Seconds until the pipeline has done everything admitted so far."""
        return max(0.0, self._free_at - self._clock())
