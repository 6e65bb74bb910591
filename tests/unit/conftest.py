"""bench/ on the import path for the tests of its helpers.

test_bench_helpers and test_bench_routing_workload import bench/'s modules by
their bare names (`_attacks`, `_workload`) and put bench/ on `sys.path` from
their own path, which names bench/ beside tests/, not beside tests/unit/. Until
bench/ is imported as a package, it is put on the path here, before they load.
"""

from __future__ import annotations

import sys

from tests.support import REPO

BENCH = str(REPO / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)
