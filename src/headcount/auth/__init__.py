"""Who may use the router and what it shows engines: client API keys and the engine key.

Both are optional (`AuthSettings`). `keys` holds keys as digests and checks a
key by its digest; `keyfile` reloads a key file without a restart;
`credentials` keeps the keys in force where the proxy and the prober read them.
"""

from headcount.auth.credentials import Authentication, Credentials
from headcount.auth.keys import ApiKeys, EngineKey, KeyFileError, parse_api_keys, parse_engine_key

__all__ = [
    "ApiKeys",
    "Authentication",
    "Credentials",
    "EngineKey",
    "KeyFileError",
    "parse_api_keys",
    "parse_engine_key",
]
