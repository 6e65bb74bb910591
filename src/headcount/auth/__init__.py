"""Who may use the router, as whom, and what it shows engines: client keys, tenants, engine key.

All optional (`AuthSettings`). `keys` holds keys as digests and finds a key's
tenant by its digest; `tenants` reads the tenants file; `keyfile` reloads a
key file without a restart; `credentials` keeps the keys and tenants in force
where the proxy and the prober read them.
"""

from headcount.auth.credentials import Authentication, Credentials
from headcount.auth.keys import ApiKeys, EngineKey, KeyFileError, parse_api_keys, parse_engine_key
from headcount.auth.tenants import Tenant, Tenants, effective_priority, parse_tenants

__all__ = [
    "ApiKeys",
    "Authentication",
    "Credentials",
    "EngineKey",
    "KeyFileError",
    "Tenant",
    "Tenants",
    "effective_priority",
    "parse_api_keys",
    "parse_engine_key",
    "parse_tenants",
]
