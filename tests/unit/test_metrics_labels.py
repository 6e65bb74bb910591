"""The `model` label is bounded: an engine that serves thousands of adapters mints no more
than `MAX_MODEL_LABELS` models' series, and a model no engine serves gives its room back."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from headcount.fleet import ProbeResult
from headcount.surfaces.metrics import MAX_MODEL_LABELS, OTHER_MODELS, UNKNOWN_MODEL, Metrics
from tests.support import ready_fleet, spec

ENGINE = spec("a")


def cards(prefix: str, count: int) -> list[dict[str, str]]:
    return [{"id": f"{prefix}-{n}", "object": "model"} for n in range(count)]


async def model_labels(metrics: Metrics) -> dict[str, float]:
    """Per `model` label, the requests `headcount_requests_total` counts."""
    counted: dict[str, float] = {}
    for family in text_string_to_metric_families((await metrics.render()).decode()):
        if family.name == "headcount_requests":
            for sample in family.samples:
                if sample.name == "headcount_requests_total":
                    model = sample.labels["model"]
                    counted[model] = counted.get(model, 0.0) + sample.value
    return counted


async def test_thousands_of_adapters_mint_a_bounded_set_of_series() -> None:
    fleet = ready_fleet(ENGINE, cards=cards("old", 2000))
    metrics = Metrics(lambda: fleet.snapshot)
    for n in range(2000):
        metrics.request_done(f"old-{n}", 200, "ok", 0.01, 0.005)
    metrics.request_done(UNKNOWN_MODEL, 404, "ok", 0.001, None)
    counted = await model_labels(metrics)
    assert len(counted) == MAX_MODEL_LABELS + 2
    assert counted[OTHER_MODELS] == 2000 - MAX_MODEL_LABELS and counted[UNKNOWN_MODEL] == 1
    assert sum(counted.values()) == 2001

    fleet.apply_probe(ENGINE.id, ProbeResult(ok=True, cards=tuple(cards("new", 10))))
    metrics.request_done("new-0", 200, "ok", 0.01, 0.005)
    counted = await model_labels(metrics)
    assert counted.get("new-0") == 1, "a model that leaves gives its series' room back"
    assert not any(model.startswith("old-") for model in counted)
    assert counted[OTHER_MODELS] == 2000 - MAX_MODEL_LABELS
