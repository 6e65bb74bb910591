"""Every async test runs on uvloop, the event loop `headcount serve` runs on.

The fixtures every test may ask for by name are offered here.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import uvloop
from pytest_asyncio.plugin import LoopFactory

from headcount.compiled import stale_compiled
from tests.support.story import story as story


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, LoopFactory]:
    return {"uvloop": uvloop.new_event_loop}


def pytest_configure(config: pytest.Config) -> None:
    """Refuse to test compiled modules older than their sources: they, not the sources
    being tested, would run."""
    stale = stale_compiled()
    if stale:
        pytest.exit(
            f"compiled modules older than their sources: {', '.join(stale)}; "
            "run `make install` to rebuild them",
            returncode=4,
        )
