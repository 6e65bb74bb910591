"""Where the repository is, for tests that read its files (docs, sources, deploy, fixtures)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPO"]

REPO = Path(__file__).resolve().parents[2]
"""The repository's root: this file is tests/support/paths.py."""
