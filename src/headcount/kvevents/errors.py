"""What fails when reading vLLM's KV events, as one exception a subscriber catches.

msgspec's decode and validation errors, and malformed ZMQ frames, are
translated here so callers never depend on the codec's exception types.
"""

from __future__ import annotations

__all__ = ["KvEventDecodeError"]


class KvEventDecodeError(ValueError):
    """Bytes that are not a KV-event batch or frame of any known vLLM layout."""
