"""The metrics contract: the metric families the README's metrics table promises, and labels."""

from __future__ import annotations

__all__ = [
    "EXPORTED_METRICS",
    "FLOW_METRIC_LABELS",
    "HISTOGRAMS",
    "KV_METRIC_LABELS",
    "METRIC_LABELS",
    "RESUME_METRIC_LABELS",
]

# The metric families the README's metrics table promises, as named in the exposition
# format (counters with `_total`, histograms by their base name).
METRIC_LABELS: dict[str, frozenset[str]] = {
    "headcount_discovery_last_sync_timestamp_seconds": frozenset({"source"}),
    "headcount_discovery_watch_connected": frozenset({"source"}),
    "headcount_discovery_relists_total": frozenset({"source", "reason"}),
    "headcount_discovery_reconcile_removed_total": frozenset({"source"}),
    "headcount_engines": frozenset({"state"}),
    "headcount_requests_total": frozenset({"model", "code", "outcome"}),
    "headcount_request_duration_seconds": frozenset({"model"}),
    "headcount_time_to_first_byte_seconds": frozenset({"model"}),
    "headcount_upstream_failovers_total": frozenset({"reason"}),
    "headcount_engine_in_flight": frozenset({"engine"}),
    "headcount_outlier_ejections_total": frozenset({"reason"}),
    "headcount_outlier_ejected_engines": frozenset(),
    "headcount_local_resource_errors_total": frozenset({"resource"}),
    "headcount_task_restarts_total": frozenset({"task"}),
    "headcount_responses_affinity_total": frozenset({"outcome"}),
    "headcount_responses_affinity_entries": frozenset(),
}
# Always exported; their series (per model and outcome) appear once a stream broke.
RESUME_METRIC_LABELS: dict[str, frozenset[str]] = {
    "headcount_stream_resumes_total": frozenset({"model", "outcome"}),
    "headcount_stream_resume_gap_seconds": frozenset({"model"}),
}
EXPORTED_METRICS = frozenset(METRIC_LABELS) | frozenset(RESUME_METRIC_LABELS)
# With --routing kv-aware only: the engines' cache indexes.
KV_METRIC_LABELS: dict[str, frozenset[str]] = {
    "headcount_kv_index_state": frozenset({"engine", "state"}),
    "headcount_kv_index_blocks": frozenset({"engine"}),
    "headcount_kv_index_hints": frozenset({"engine"}),
    "headcount_kv_index_memory_bytes": frozenset({"engine"}),
    "headcount_kv_index_memory_limit_bytes": frozenset({"engine"}),
    "headcount_kv_index_refused_blocks_total": frozenset({"engine"}),
    "headcount_kv_events_applied_total": frozenset({"engine"}),
    "headcount_kv_event_gaps_total": frozenset({"engine"}),
    "headcount_kv_replays_total": frozenset({"engine", "outcome"}),
    "headcount_kv_index_clears_total": frozenset({"engine", "reason"}),
    "headcount_kv_last_event_age_seconds": frozenset({"engine"}),
    "headcount_kv_predicted_cached_tokens_total": frozenset({"engine"}),
    "headcount_kv_engine_reported_hit_tokens_total": frozenset({"engine"}),
}
# With --tenants-file only (flow control): tenants, the router's queue, the limits store.
# `engine_capacity` has a series once the router has learned the engine's capacity.
FLOW_METRIC_LABELS: dict[str, frozenset[str]] = {
    "headcount_tenant_requests_total": frozenset({"tenant", "outcome"}),
    "headcount_tenant_tokens_total": frozenset({"tenant", "kind"}),
    "headcount_queue_seconds": frozenset({"tenant"}),
    "headcount_queue_depth": frozenset({"priority"}),
    "headcount_engine_capacity": frozenset({"engine"}),
    "headcount_limits_store_up": frozenset(),
    "headcount_limits_store_fail_open_total": frozenset(),
}
HISTOGRAMS = frozenset(
    {
        "headcount_request_duration_seconds",
        "headcount_time_to_first_byte_seconds",
        "headcount_queue_seconds",
        "headcount_stream_resume_gap_seconds",
    }
)
