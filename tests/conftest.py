"""Every async test runs on uvloop, the event loop `headcount serve` runs on.

The fixtures every test may ask for by name are offered here.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import uvloop
from pytest_asyncio.plugin import LoopFactory

from tests.support.story import story as story


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, LoopFactory]:
    return {"uvloop": uvloop.new_event_loop}
