"""Where the Kubernetes API server is: an explicit kubeconfig, in-cluster, or the usual files.

`load_kube_config` finds the cluster (an explicit kubeconfig, else in-cluster,
else `$KUBECONFIG`, else `~/.kube/config`) and the default namespace, and says
in a `ConfigError` what it tried when none of them can be used.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml
from kubernetes_asyncio import config as k8s_config
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config.incluster_config import InClusterConfigLoader

from headcount.config import ConfigError

__all__ = ["SERVICE_ACCOUNT_DIR", "KubeConfig", "load_kube_config"]

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class KubeConfig:
    """Where the API server is and how to authenticate, plus the default namespace."""

    configuration: Configuration
    namespace: str
    origin: str
    """For the logs: `in-cluster` or the kubeconfig path(s)."""


async def load_kube_config(
    kubeconfig: Path | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> KubeConfig:
    """An explicit `kubeconfig`, else in-cluster, else `$KUBECONFIG`, else `~/.kube/config`.

    The namespace is the in-cluster pod's own, else the kubeconfig context's,
    else `default`. Raises `ConfigError` saying what was tried.
    """
    if kubeconfig is not None:
        return await _from_kubeconfig(str(kubeconfig))
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return await asyncio.to_thread(_in_cluster, environ, service_account_dir)
    return await _from_kubeconfig(await asyncio.to_thread(_default_kubeconfig, environ))


def _default_kubeconfig(environ: Mapping[str, str]) -> str:
    """`$KUBECONFIG` (a path list) or `~/.kube/config`, if any of it exists."""
    paths = environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if not any(Path(path).expanduser().is_file() for path in paths.split(os.pathsep) if path):
        raise ConfigError(
            f"no Kubernetes configuration: not in a cluster (KUBERNETES_SERVICE_HOST unset) "
            f"and no kubeconfig at {paths}; pass --kubeconfig PATH"
        )
    return paths


async def _from_kubeconfig(paths: str) -> KubeConfig:
    configuration = Configuration()
    try:
        loader = await k8s_config.load_kube_config(
            config_file=paths, client_configuration=configuration, persist_config=False
        )
    except (
        k8s_config.ConfigException,
        OSError,
        ValueError,
        yaml.YAMLError,
        TypeError,
        KeyError,
        AttributeError,
    ) as exc:
        reason = str(exc).replace("\n", " ") or type(exc).__name__
        raise ConfigError(f"kubeconfig {paths} cannot be used: {reason}") from None
    context = (loader.current_context or {}).get("context") or {}
    return KubeConfig(configuration, context.get("namespace") or "default", paths)


def _in_cluster(environ: Mapping[str, str], service_account_dir: Path) -> KubeConfig:
    configuration = Configuration()
    try:
        InClusterConfigLoader(
            token_filename=str(service_account_dir / "token"),
            cert_filename=str(service_account_dir / "ca.crt"),
            environ=dict(environ),
        ).load_and_set(configuration)
    except (k8s_config.ConfigException, OSError) as exc:
        raise ConfigError(f"in-cluster Kubernetes configuration: {exc}") from None
    namespace_file = service_account_dir / "namespace"
    namespace = namespace_file.read_text().strip() if namespace_file.is_file() else ""
    return KubeConfig(configuration, namespace or "default", "in-cluster")
