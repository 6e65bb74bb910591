"""TLS to engines: one client context for every https engine, built once at start.

The proxy's pools, its `/tokenize` calls and the probes all dial https engines
with the same `EngineTls`: verification on unless `--engine-tls-insecure-skip-verify`,
the CA bundle of `--engine-tls-ca-file` (else the system's), the client
certificate of `--engine-tls-cert-file` if the engines require one, and as the
server name (SNI, and what the certificate must name) the engine's own host
name, or `--engine-tls-server-name` for all of them (a pod IP is rarely in a
certificate). Reading the files happens here, once: a missing, unreadable or
mismatched file is a `ConfigError` in one line, never a failure at the first request.

    tls = build_engine_tls(settings.engine_tls)     # ConfigError naming the flag
    await loop.create_connection(factory, address, port, ssl=tls.context,
                                 server_hostname=tls.server_name or host)
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass

from headcount.config import ConfigError, EngineTlsSettings

__all__ = ["EngineTls", "build_engine_tls", "tls_failure"]


@dataclass(frozen=True, slots=True)
class EngineTls:
    """The client side of every TLS connection to an engine."""

    context: ssl.SSLContext
    server_name: str | None = None
    """Sent and verified in place of each engine's host name; None: the host name."""
    client_certificate: bool = False
    """Whether the router proves itself with a certificate (`--engine-tls-cert-file`)."""

    def server_hostname(self, host: str) -> str:
        """The name an engine at `host` is asked for and must prove."""
        return self.server_name or host


def build_engine_tls(settings: EngineTlsSettings) -> EngineTls:
    """The context `settings` describe; `ConfigError` if a file cannot be used (blocking:
    it reads the files, so call it before serving or in a thread)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if settings.insecure_skip_verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif settings.ca_file is not None:
        ca = settings.ca_file
        _load(f"--engine-tls-ca-file {ca}", lambda: context.load_verify_locations(cafile=ca))
    if settings.cert_file is not None:
        cert, key = settings.cert_file, settings.key_file
        named = f"--engine-tls-cert-file {cert}"
        if key is not None:
            named += f" with --engine-tls-key-file {key}"
        _load(named, lambda: context.load_cert_chain(cert, key, password=_no_password))
    return EngineTls(context, settings.server_name, settings.cert_file is not None)


def _load(named: str, load: Callable[[], None]) -> None:
    """Run `load`; any failure is a `ConfigError` starting with `named` (the flags, the files)."""
    try:
        load()
    except _EncryptedKey:
        raise ConfigError(f"{named}: the key is encrypted; give it unencrypted") from None
    except ssl.SSLError as exc:
        raise ConfigError(f"{named}: {_reason(exc)}") from None
    except OSError as exc:
        raise ConfigError(f"{named}: {exc.strerror or exc}") from None


class _EncryptedKey(Exception):
    """The key asked for a password: the router has none to give, and must not prompt."""


def _no_password() -> bytes:
    raise _EncryptedKey


def _reason(exc: ssl.SSLError) -> str:
    """What OpenSSL says, without its source position: "key values mismatch"."""
    reasons = {
        "KEY_VALUES_MISMATCH": "the key does not match the certificate",
        "NO_CERTIFICATE_OR_CRL_FOUND": "no PEM certificate in it",
    }
    reason = _ssl_reason(exc)
    if reason is None:  # OpenSSL's PEM reader gives none: "[SSL] PEM lib"
        return "not a PEM certificate and key"
    return reasons.get(reason, reason.replace("_", " ").lower())


def tls_failure(exc: ssl.SSLError) -> str:
    """A failed handshake in a line for `/engines`: "certificate verify failed:
    Hostname mismatch, ...", "tlsv13 alert certificate required"."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        verify_message: str | None = getattr(exc, "verify_message", None)
        return f"certificate verify failed: {verify_message or exc}"
    return (_ssl_reason(exc) or str(exc)).replace("_", " ").lower()


def _ssl_reason(exc: ssl.SSLError) -> str | None:
    """OpenSSL's reason code, None when it gave none (typeshed says `str`: mypyc would raise)."""
    reason: str | None = getattr(exc, "reason", None)
    return reason
