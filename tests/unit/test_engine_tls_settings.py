"""Engines behind TLS, the pure parts: which URLs and schemes are https, the TLS flags and their
checks, and the context built from the files (one line naming the flag when one is unusable)."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from headcount._http.tls import build_engine_tls
from headcount.cli.main import _parser
from headcount.cli.serve_flags import settings_from_args
from headcount.cli.serve_hints import serve_hints
from headcount.config import (
    ConfigError,
    DiscoveryMode,
    DiscoverySettings,
    EngineScheme,
    EngineTlsSettings,
)
from headcount.discovery.pods import pod_to_spec
from headcount.discovery.services import service_to_spec
from headcount.flags.parser import given_flags


def serve(*args: str) -> Any:
    return _parser().parse(["serve", *args])


def test_static_engines_may_be_https_and_other_schemes_are_refused() -> None:
    settings = DiscoverySettings(backends=("https://vllm.llm:8443/v1", "http://10.0.0.1:8000"))
    assert settings.backends == ("https://vllm.llm:8443", "http://10.0.0.1:8000")
    with pytest.raises(ConfigError, match=r"'ftp://x': expected http://host:port or https://"):
        DiscoverySettings(backends=("ftp://x",))


def test_the_tls_flags_fill_the_engine_tls_settings(tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem"))
    for path in (ca, cert, key):
        path.write_text("pem")
    settings = settings_from_args(
        serve(
            "--discovery=k8s-pods",
            "--engine-scheme=HTTPS",
            f"--engine-tls-ca-file={ca}",
            f"--engine-tls-cert-file={cert}",
            f"--engine-tls-key-file={key}",
            "--engine-tls-server-name=vllm.llm.svc",
        )
    )
    assert settings.discovery.engine_scheme is EngineScheme.HTTPS
    assert settings.engine_tls == EngineTlsSettings(
        ca_file=ca, cert_file=cert, key_file=key, server_name="vllm.llm.svc"
    )
    defaults = settings_from_args(serve("--backends=https://h:1"))
    assert defaults.discovery.engine_scheme is EngineScheme.HTTP
    assert defaults.engine_tls == EngineTlsSettings()
    assert not defaults.engine_tls.insecure_skip_verify, "verification is on by default"


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"ca_file": Path("/nonexistent/ca.pem")}, "--engine-tls-ca-file /nonexistent/ca.pem: no"),
        ({"key_file": "FILE"}, "--engine-tls-key-file needs --engine-tls-cert-file"),
        ({"server_name": " "}, "--engine-tls-server-name must not be empty"),
        ({"insecure_skip_verify": True, "ca_file": "FILE"}, "drop it or --engine-tls-ca-file"),
    ],
)
def test_engine_tls_settings_are_checked_naming_the_flag(
    fields: dict[str, Any], needle: str, tmp_path: Path
) -> None:
    existing = tmp_path / "file.pem"
    existing.write_text("pem")
    given = {name: existing if value == "FILE" else value for name, value in fields.items()}
    with pytest.raises(ConfigError, match=needle):
        EngineTlsSettings(**given)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a certificate and key it issued, a key of another, and a file that is no PEM."""
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    leaf, other = ca.issue_cert("router"), trustme.CA().issue_cert("other")
    names = ("ca", "cert", "key", "other", "junk", "locked")
    files = {name: directory / f"{name}.pem" for name in names}
    ca.cert_pem.write_to_path(str(files["ca"]))
    leaf.cert_chain_pems[0].write_to_path(str(files["cert"]))
    leaf.private_key_pem.write_to_path(str(files["key"]))
    other.private_key_pem.write_to_path(str(files["other"]))
    files["junk"].write_text("not a certificate\n")
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    encryption = serialization.BestAvailableEncryption(b"secret")
    files["locked"].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    return files


def test_the_context_verifies_by_default_with_the_given_ca_and_certificate(
    pki: dict[str, Path],
) -> None:
    tls = build_engine_tls(
        EngineTlsSettings(ca_file=pki["ca"], cert_file=pki["cert"], key_file=pki["key"])
    )
    assert tls.context.verify_mode is ssl.CERT_REQUIRED and tls.context.check_hostname
    assert tls.client_certificate
    assert [c["subject"] for c in tls.context.get_ca_certs()] != []
    assert tls.server_hostname("10.1.2.3") == "10.1.2.3"
    named = build_engine_tls(EngineTlsSettings(server_name="vllm.llm.svc"))
    assert named.server_hostname("10.1.2.3") == "vllm.llm.svc"
    insecure = build_engine_tls(EngineTlsSettings(insecure_skip_verify=True))
    assert insecure.context.verify_mode is ssl.CERT_NONE


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ca_file": "junk"}, "--engine-tls-ca-file {junk}: no PEM certificate in it"),
        (
            {"cert_file": "cert", "key_file": "other"},
            "--engine-tls-cert-file {cert} with --engine-tls-key-file {other}: "
            "the key does not match the certificate",
        ),
        ({"cert_file": "junk"}, "--engine-tls-cert-file {junk}: not a PEM certificate and key"),
        (
            {"cert_file": "cert", "key_file": "locked"},
            "--engine-tls-cert-file {cert} with --engine-tls-key-file {locked}: "
            "the key is encrypted; give it unencrypted",
        ),
    ],
)
def test_an_unusable_file_is_one_line_naming_flag_and_file(
    pki: dict[str, Path], fields: dict[str, str], message: str
) -> None:
    settings = EngineTlsSettings(**{name: pki[value] for name, value in fields.items()})
    with pytest.raises(ConfigError) as raised:
        build_engine_tls(settings)
    assert str(raised.value) == message.format(**pki)


POD = {
    "metadata": {"name": "p1", "namespace": "llm", "uid": "u1", "labels": {}},
    "status": {
        "phase": "Running",
        "podIP": "10.1.0.7",
        "conditions": [{"type": "Ready", "status": "True"}],
    },
}


def test_pods_are_https_engines_with_engine_scheme_https() -> None:
    plain = pod_to_spec(POD, source="k8s-pods", engine_port=8000)
    secure = pod_to_spec(POD, source="k8s-pods", engine_port=8443, scheme=EngineScheme.HTTPS)
    assert plain is not None and plain.url == "http://10.1.0.7:8000"
    assert secure is not None and secure.url == "https://10.1.0.7:8443"


def service_url(ports: list[dict[str, Any]], scheme: EngineScheme = EngineScheme.HTTP) -> str:
    service = {
        "metadata": {"name": "vllm", "namespace": "llm", "uid": "s1"},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.9", "ports": ports},
    }
    spec = service_to_spec(service, [], source="k8s-services", engine_port=None, scheme=scheme)
    assert spec is not None
    return spec.url


@pytest.mark.parametrize(
    ("ports", "url"),
    [
        ([{"name": "http", "port": 80}], "http://vllm.llm:80"),
        ([{"name": "https", "port": 443}], "https://vllm.llm:443"),
        ([{"name": "https-api", "port": 8443}], "https://vllm.llm:8443"),
        ([{"name": "api", "port": 8443, "appProtocol": "HTTPS"}], "https://vllm.llm:8443"),
        ([{"name": "grpc", "port": 9000}, {"name": "https", "port": 443}], "https://vllm.llm:443"),
        ([{"name": "api", "port": 8000, "appProtocol": "http"}], "http://vllm.llm:8000"),
    ],
)
def test_a_service_port_named_or_declared_https_makes_an_https_engine(
    ports: list[dict[str, Any]], url: str
) -> None:
    assert service_url(ports) == url


def test_engine_scheme_https_makes_every_service_https() -> None:
    assert service_url([{"name": "http", "port": 80}], EngineScheme.HTTPS) == "https://vllm.llm:80"


def hints(*args: str) -> list[str]:
    ns = serve(*args)
    return serve_hints(settings_from_args(ns), given_flags(ns), ns.backends)


def test_tls_flags_without_an_https_engine_and_engine_scheme_in_static_mode_are_named() -> None:
    assert hints("--backends=https://h:1", "--engine-tls-server-name=h.test") == []
    [unused] = hints("--backends=http://h:1", "--engine-tls-server-name=h.test")
    assert (
        unused
        == "--engine-tls-server-name: not used with no https:// engine in --backends; ignored"
    )
    [static] = hints("--backends=https://h:1", "--engine-scheme=https")
    assert static.startswith("--engine-scheme: not used with --discovery static")


def test_kubernetes_modes_take_the_engine_scheme() -> None:
    ns = serve("--discovery=k8s-services", "--engine-scheme=https")
    settings = settings_from_args(ns)
    assert settings.discovery.mode is DiscoveryMode.K8S_SERVICES
    assert settings.discovery.engine_scheme is EngineScheme.HTTPS
