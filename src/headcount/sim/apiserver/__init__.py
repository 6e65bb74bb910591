"""An in-memory Kubernetes API server on loopback, so discovery is tested against the real protocol.

Kubernetes cannot run where headcount is built, so this emulator speaks the
kube-apiserver's HTTP API closely enough for the official clients and kubectl,
for four resources: core/v1 Pods and Services, discovery.k8s.io/v1
EndpointSlices, and the custom resource inference.networking.k8s.io/v1
InferencePool (as with its CRD installed; its spec checked as the CRD does).
It serves LIST with label and field selectors, chunked WATCH from a
resourceVersion (history replay, selector transitions, bookmarks,
``timeoutSeconds``), a bounded history whose older versions answer ``410
Expired``, discovery documents, Table output for kubectl, and every error as a
``Status`` object. On top come the faults a client must survive::

    async with running_apiserver(ApiServerSimConfig(bookmark_interval=0.5)) as sim:
        sim.kubeconfig(tmp_path / "kubeconfig")
        sim.apply_pod(make_pod("engine-0", labels={"app": "vllm"}, ip="127.0.0.2"))
        await sim.drop_watches(reset=True)  # every open watch ends with a TCP reset
        sim.compact()  # any older resourceVersion now answers 410
        await sim.refuse()  # ECONNREFUSED ...
        await sim.restore()  # ... then the same port serves again

The same controls exist over HTTP on the server itself, and on
``config.admin_port`` if set, which serves only them and no fault closes
(JSON bodies)::

    GET    /_sim/state
    POST   /_sim/faults/{drop-watches|refuse|blackhole|stall|compact|restore}
           drop-watches: {"reset": bool}; refuse: {"seconds": N}, required, since
           a refusing server cannot be told to restore
    PUT    /_sim/objects                           create or replace (kind from the body)
    PATCH  /_sim/objects/{plural}/{namespace}/{name}  JSON merge patch
    DELETE /_sim/objects/{plural}/{namespace}/{name}[?graceful=true]

The real API's create (POST), replace (PUT), merge patch (PATCH) and delete
(DELETE) work too; a REST DELETE removes a pod at once, as for a pod no kubelet
runs. With ``config.kubelet`` a created pod without an IP is started
(``kubelet.py``), so ``kubectl apply`` alone makes an engine.
Not modelled: namespaces as objects, authentication, pagination
(``limit`` is ignored, as when the real server lists from its cache),
protobuf, server-side apply, OpenAPI beyond the minimal v2 document kubectl
validates against (``openapi.py``).
"""

from headcount.sim.apiserver.builders import (
    make_endpointslice,
    make_inference_pool,
    make_pod,
    make_service,
)
from headcount.sim.apiserver.cli import add_arguments, config_from_args, main, serve_forever
from headcount.sim.apiserver.config import ApiServerSimConfig
from headcount.sim.apiserver.resources import Kind
from headcount.sim.apiserver.server import ApiServerSim, running_apiserver, start_apiserver
from headcount.sim.apiserver.status import StatusError

__all__ = [
    "ApiServerSim",
    "ApiServerSimConfig",
    "Kind",
    "StatusError",
    "add_arguments",
    "config_from_args",
    "main",
    "make_endpointslice",
    "make_inference_pool",
    "make_pod",
    "make_service",
    "running_apiserver",
    "serve_forever",
    "start_apiserver",
]
