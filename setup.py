"""headcount's data plane, compiled ahead of time with mypyc.

The request's path (`_http/`, `proxy/`, `flow/` and the modules each request calls into,
`COMPILED`) is typed Python that mypyc turns into C extension modules, one beside each
source file; everything else stays interpreted. The sources remain the truth: Python
imports a module's compiled form when it is there and its source otherwise, so the
pure-Python path works anywhere and is tested too (`make test` runs both;
docs/DEVELOPING.md says how).

`pip install .` compiles (it needs a C compiler and Python's headers);
`HEADCOUNT_PURE_PYTHON=1 pip install .` installs the sources alone. `make install` builds
in place, into `src/`, and rebuilds when a compiled module's source changes.
"""

from __future__ import annotations

import os
from pathlib import Path

from setuptools import Extension, setup

COMPILED = (
    "_http/",
    "proxy/",
    "flow/",
    "fleet/engine.py",  # an engine's load, counted by every request
    "routing/policy.py",  # the features every request's routing reads
    "auth/keys.py",  # the key check and the tenant a key names
    "auth/credentials.py",
    "auth/tenants.py",
    "surfaces/served.py",  # the request series, counted by every request
    "surfaces/metrics.py",
    "surfaces/access_log.py",
)
"""Below `src/headcount/`: whole packages (`/`) and single modules. A class that tests or
other modules subclass stays interpreted (mypyc's classes cannot be subclassed from
Python): the routing policies, `Fleet`. The Makefile rebuilds when a file of these
packages changes: a module of another package needs its package named there too."""
NOT_COMPILED = {"_http/errors.py"}
"""Its exception tree uses multiple inheritance, which mypyc's native classes do not have
(and it is off the common path). Package markers (`__init__.py`) gain nothing either."""


def compiled_sources() -> list[str]:
    """The source files mypyc compiles, relative to this file."""
    package = Path(__file__).parent / "src" / "headcount"
    paths = [
        path
        for entry in COMPILED
        for path in ((package / entry).glob("*.py") if entry.endswith("/") else [package / entry])
    ]
    return sorted(
        str(path.relative_to(Path(__file__).parent))
        for path in paths
        if path.name != "__init__.py" and str(path.relative_to(package)) not in NOT_COMPILED
    )


def extensions() -> list[Extension]:
    if os.environ.get("HEADCOUNT_PURE_PYTHON") == "1":
        return []
    from mypyc.build import mypycify

    return mypycify(
        compiled_sources(), opt_level="3", target_dir=".cache/mypyc", group_name="headcount"
    )


setup(ext_modules=extensions())
