"""headcount: an OpenAI-compatible router whose picture of the fleet never silently goes stale."""

__version__ = "0.1.0"
