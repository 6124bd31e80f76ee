"""The reference autoscalers, driven by hand: Kubernetes' HPA (its replica calculation,
tolerance, stabilization and policies), KEDA's Prometheus scaler (activation, cooldown,
scale to zero and back), the SLO scaler, PromQL over scraped samples, and plug-ins."""

from __future__ import annotations

import pytest

from inference_lab.autoscale.hpa import HPA, HorizontalPodAutoscaler
from inference_lab.autoscale.keda import KedaPrometheusScaler
from inference_lab.autoscale.metrics import (FRONT, FRONT_REQUESTS, FleetView, MetricStore, Pod,
                                             QueryError, parse_exposition, parse_query)
from inference_lab.autoscale.registry import AutoscalerError, make_autoscaler
from inference_lab.autoscale.slo import SLOScaler

WAITING = "vllm:num_requests_waiting"


def pods(ready: int, starting: int = 0, draining: int = 0) -> list[Pod]:
    out = [Pod(i, True, False, False) for i in range(ready)]
    out += [Pod(ready + i, False, True, False) for i in range(starting)]
    out += [Pod(ready + starting + i, False, False, True) for i in range(draining)]
    return out


def view(now: float, values: dict[int, float], fleet: list[Pod], name: str = WAITING,
         store: MetricStore | None = None) -> FleetView:
    store = store or MetricStore()
    store.scrape_round(now, {i: {name: v} for i, v in values.items()})
    return FleetView(now, sum(1 for p in fleet if not p.draining), fleet, store, "m")


# ---- HPA: the replica calculation --------------------------------------------------------

def test_hpa_scales_to_ceil_of_current_times_metric_over_target():
    hpa = HorizontalPodAutoscaler(WAITING, target=10, max_replicas=16)
    # 3 pods averaging 25 waiting against 10: ceil(3 x 2.5) = 8, within the up policy
    # (max of 100 % and 4 pods per 15 s from 3: 6 and 7 -> 7)
    assert hpa.decide(0.0, view(0.0, {0: 20, 1: 25, 2: 30}, pods(3))) == 7


def test_hpa_keeps_its_count_within_the_tolerance():
    hpa = HorizontalPodAutoscaler(WAITING, target=10)
    assert hpa.decide(0.0, view(0.0, {0: 10.9, 1: 10.9}, pods(2))) is None  # ratio 1.09
    assert hpa.decide(15.0, view(15.0, {0: 11.2, 1: 11.2}, pods(2))) == 3  # 1.12: ceil(2.24)


def test_hpa_counts_missing_pods_at_zero_on_a_scale_up_and_at_target_on_a_scale_down():
    calc = HPA(1, 10)
    # two ready pods at 30 (ratio 3), two starting without metrics: (30+30+0+0)/4/10 = 1.5
    v = view(0.0, {0: 30, 1: 30}, pods(2, starting=2))
    assert calc.pods_proposal(4, v, WAITING, 10) == 6
    # a scale-down: ready pods at 2 (ratio 0.2), the missing one counted at the target:
    # (2 + 2 + 10) / 3 / 10 = 0.467 -> ceil(1.4) = 2
    v = view(0.0, {0: 2, 1: 2}, pods(2, starting=1))
    assert calc.pods_proposal(3, v, WAITING, 10) == 2
    # missing pods that flip the direction keep the count: (12 + 0) / 2 / 10 = 0.6 < 1
    v = view(0.0, {0: 12}, pods(1, starting=1))
    assert calc.pods_proposal(2, v, WAITING, 10) == 2


def test_hpa_ignores_draining_pods_and_decides_nothing_without_metrics():
    calc = HPA(1, 10)
    v = view(0.0, {0: 20, 1: 20, 2: 99}, pods(2, draining=1))
    assert calc.pods_proposal(2, v, WAITING, 10) == 4  # the draining pod's 99 is not counted
    assert calc.pods_proposal(2, view(0.0, {}, pods(0, starting=2)), WAITING, 10) is None


# ---- HPA: behaviour ----------------------------------------------------------------------------

def test_hpa_scale_down_waits_for_the_stabilization_window():
    hpa = HorizontalPodAutoscaler(WAITING, target=10, max_replicas=16)
    assert hpa.decide(0.0, view(0.0, {i: 10 for i in range(8)}, pods(8))) is None  # on target
    # load falls to 1 per pod: the raw recommendation is 1, but the recommendation of t=0 (8)
    # is within the 300 s window, so the HPA holds 8 ...
    for t in range(15, 300, 15):
        assert hpa.decide(float(t), view(float(t), {i: 1 for i in range(8)}, pods(8))) is None
    # ... until t = 300 + a sync, when every recommendation of the window says 1
    assert hpa.decide(315.0, view(315.0, {i: 1 for i in range(8)}, pods(8))) == 1


def test_hpa_scale_up_is_capped_by_the_policies_per_period():
    hpa = HorizontalPodAutoscaler(WAITING, target=1, max_replicas=64)
    # 2 pods at 100 each want 200; per 15 s: max(2 x 2, 2 + 4) = 6
    assert hpa.decide(0.0, view(0.0, {0: 100, 1: 100}, pods(2))) == 6
    # 5 s later the period still holds the +4: its start count is 2 again -> 6, no change
    assert hpa.decide(5.0, view(5.0, {0: 100, 1: 100}, pods(2, starting=4))) is None
    # a period later: from 6, max(12, 10) = 12
    assert hpa.decide(15.0, view(15.0, {i: 100 for i in range(6)}, pods(6))) == 12


def test_hpa_bounds_and_custom_behaviour():
    hpa = HorizontalPodAutoscaler(WAITING, target=10, min_replicas=2, max_replicas=5,
                                  scale_down={"stabilizationWindowSeconds": 0,
                                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]})
    assert hpa.decide(0.0, view(0.0, {0: 0}, pods(1))) == 2  # below min_replicas
    hpa = HorizontalPodAutoscaler(WAITING, target=10, min_replicas=2, max_replicas=5,
                                  scale_down={"stabilizationWindowSeconds": 0,
                                              "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]})
    assert hpa.decide(15.0, view(15.0, {i: 0 for i in range(4)}, pods(4))) == 3  # one pod per minute
    assert hpa.decide(30.0, view(30.0, {i: 0 for i in range(3)}, pods(3))) is None
    assert hpa.decide(75.0, view(75.0, {i: 0 for i in range(3)}, pods(3))) == 2
    with pytest.raises(ValueError, match=r"scale_down.policies\[0\].type: expected Pods or Percent"):
        HorizontalPodAutoscaler(scale_down={"policies": [{"type": "Ratio", "value": 1, "periodSeconds": 5}]})


def test_hpa_does_nothing_at_zero_replicas():
    hpa = HorizontalPodAutoscaler(WAITING, target=10)
    assert hpa.decide(0.0, view(0.0, {}, [])) is None


# ---- KEDA ---------------------------------------------------------------------------------------

def test_keda_activates_from_zero_then_its_hpa_scales_on_the_threshold():
    keda = KedaPrometheusScaler(f"sum(rate({FRONT_REQUESTS}[1m]))", threshold=5, max_replica_count=10)
    assert keda.interval == 15.0  # gcd of polling 30 s and the HPA's 15 s
    store = MetricStore()
    store.scrape_round(-15.0, {FRONT: {FRONT_REQUESTS: 0}})
    store.scrape_round(0.0, {FRONT: {FRONT_REQUESTS: 300}})  # 20 requests/s
    assert keda.decide(0.0, FleetView(0.0, 0, [], store, "m")) == 1  # activation: to 1
    store.scrape_round(15.0, {FRONT: {FRONT_REQUESTS: 600}})
    # the HPA at 15 s: 20/s over threshold 5 -> ceil(4) = 4, within max(2, 1 + 4)
    assert keda.decide(15.0, FleetView(15.0, 1, pods(1), store, "m")) == 4


def test_keda_scales_to_zero_only_after_the_cooldown_since_last_active():
    keda = KedaPrometheusScaler("sum(vllm:num_requests_waiting)", threshold=5, cooldown_period=300)
    store = MetricStore()

    def at(t: float, waiting: float, replicas: int):
        store.scrape_round(t, {0: {WAITING: waiting}} if replicas else {})
        return keda.decide(t, FleetView(t, replicas, pods(replicas), store, "m"))

    assert at(0.0, 3, 1) is None  # active (3 > 0) at 1 replica: ceil(3 / 5) = 1
    decisions = {t: at(float(t), 0, 1) for t in range(15, 331, 15)}
    # inactive from t = 30 (the first poll after 0 at 30 s); last active at 0, so the poll
    # at 330 (330 > 0 + 300) scales to 0; the poll at 300 is not past the cooldown
    assert decisions[300] is None and decisions[330] == 0
    assert all(v is None for t, v in decisions.items() if t < 330)


def test_keda_with_a_minimum_never_goes_below_it():
    keda = KedaPrometheusScaler("sum(vllm:num_requests_waiting)", threshold=5, min_replica_count=2)
    assert keda.decide(0.0, view(0.0, {0: 0}, pods(1))) == 2


# ---- the SLO scaler ------------------------------------------------------------------------------

def test_the_slo_scaler_follows_the_arrival_rate_and_holds_its_scale_down():
    slo = SLOScaler(capacity_rps=10, target_utilization=0.8, scale_down_window=60, max_replicas=8)
    store = MetricStore()
    store.scrape_round(-30.0, {FRONT: {FRONT_REQUESTS: 0}})
    store.scrape_round(0.0, {FRONT: {FRONT_REQUESTS: 1200}})  # 40/s: ceil(40 / 8) = 5
    assert slo.decide(0.0, FleetView(0.0, 1, pods(1), store, "m")) == 5
    store.scrape_round(30.0, {FRONT: {FRONT_REQUESTS: 1500}})  # 10/s over [0, 30]: wants 2
    assert slo.decide(30.0, FleetView(30.0, 5, pods(5), store, "m")) is None  # held
    store.scrape_round(61.0, {FRONT: {FRONT_REQUESTS: 1810}})
    assert slo.decide(61.0, FleetView(61.0, 5, pods(5), store, "m")) == 2


# ---- metrics and PromQL --------------------------------------------------------------------------

def test_the_exposition_parser_sums_label_sets_of_the_model():
    text = ('# HELP x\nvllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
            'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5.0\n'
            'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0\n'
            'vllm:num_requests_waiting{engine="0",model_name="other"} 9.0\n')
    assert parse_exposition(text, "m") == {WAITING: 3.0, "vllm:request_success_total": 7.0}


def test_queries_aggregate_and_rate_over_present_series_only():
    store = MetricStore()
    store.scrape_round(0.0, {0: {WAITING: 2, "vllm:request_success_total": 10},
                             1: {WAITING: 4, "vllm:request_success_total": 0}})
    store.scrape_round(10.0, {0: {WAITING: 6, "vllm:request_success_total": 30},
                              1: {WAITING: 8, "vllm:request_success_total": 5}})
    q = lambda text, now=10.0: parse_query(text).evaluate(store, now, "m")  # noqa: E731
    assert (q("sum(vllm:num_requests_waiting)"), q("avg(vllm:num_requests_waiting)"),
            q("max(vllm:num_requests_waiting)"), q("count(vllm:num_requests_waiting)")) == (14, 7, 8, 2)
    assert q('vllm:num_requests_waiting{engine="1"}') == 8
    assert q("sum(vllm:num_requests_waiting)", now=5.0) == 6  # as of t = 5: the first scrape
    assert q("sum(rate(vllm:request_success_total[1m]))") == pytest.approx(2.0 + 0.5)
    assert q('sum(vllm:num_requests_waiting{model_name="other"})') is None
    store.scrape_round(20.0, {0: {WAITING: 1}})  # replica 1 was not scraped: stale
    assert q("sum(vllm:num_requests_waiting)", now=20.0) == 1
    with pytest.raises(QueryError, match="returned 2 series"):
        q("vllm:num_requests_waiting", now=10.0) if store.scrape_round(
            21.0, {0: {WAITING: 1}, 1: {WAITING: 1}}) is None else None


@pytest.mark.parametrize("text, message", [
    ("histogram_quantile(0.9, x)", "'histogram_quantile' is not supported"),
    ("sum(vllm:no_such_metric)", "unknown metric 'vllm:no_such_metric'"),
    ("sum(rate(vllm:num_requests_waiting[1m]))", "rate of 'vllm:num_requests_waiting', which is a gauge"),
    ('sum(vllm:num_requests_waiting{pod="a"})', "label 'pod' is not supported"),
    ("sum by (engine) (vllm:num_requests_waiting)", "'sum' is not supported"),
])
def test_queries_outside_the_subset_are_refused_naming_what(text, message):
    with pytest.raises(QueryError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_query(text)


# ---- the registry and plug-ins --------------------------------------------------------------------

class Halver:
    """A user's autoscaler: half the pods, every 10 s."""

    interval = 10.0

    def __init__(self, floor: int = 1) -> None:
        self.floor = floor

    def decide(self, now, view):
        return max(self.floor, view.replicas // 2)


def test_a_user_class_plugs_in_by_its_import_path_with_its_params():
    scaler = make_autoscaler(f"{__name__}:Halver", {"floor": 3})
    assert isinstance(scaler, Halver) and scaler.floor == 3
    assert scaler.decide(0.0, view(0.0, {}, pods(8))) == 4


@pytest.mark.parametrize("name, params, message", [
    ("hpa", {"target_value": 3}, "has no parameter 'target_value'"),
    ("hpa", {"target": -1}, "target must be > 0"),
    ("keda", {"query": "avg(nope)"}, "unknown metric 'nope'"),
    ("nosuch", {}, "unknown autoscaler 'nosuch'"),
    ("collections:OrderedDict", {}, "expected an object with `interval`"),
    ("no.such.module:Cls", {}, "cannot import no.such.module"),
    ("slo", {}, "needs capacity_rps"),
])
def test_bad_autoscalers_are_refused_naming_what(name, params, message):
    with pytest.raises(AutoscalerError, match=message.replace("(", r"\(")):
        make_autoscaler(name, params)
