"""What the router shows of itself: admin endpoints, health, metrics, gRPC health, logs of requests.

`admin.py` serves `/v1/models`, `/engines`, `/livez`, `/readyz`, `/health` and
`/metrics`; `health.py` decides liveness, readiness and status (pure);
`grpc_health.py` mirrors them over `grpc.health.v1`; `metrics.py` is the
Prometheus registry the data plane records into; `kv_views.py` is what the KV
indexes report; `access_log.py` is the per-request log line.
"""

__all__: list[str] = []
