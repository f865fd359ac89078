"""The latency protocol (`core.latency`): warm-up and stopping rule honoured, arms interleaved, a noisy arm flagged.
Timed with a fake clock, so the tests count calls and never depend on the machine's speed."""
import pytest
import torch

from core.errors import UserError
from core.latency import LatencyProtocol, measure

CPU = torch.device("cpu")


class FakeClock:
    """Each arm's call advances the clock by the arm's next duration; the calls are logged in order."""

    def __init__(self):
        self.now, self.calls = 0.0, []

    def __call__(self):
        return self.now

    def arm(self, name, durations):
        it = iter(durations)

        def call():
            self.calls.append(name)
            self.now += next(it)
        return call


def test_warmup_then_at_least_min_count_and_min_seconds():
    clock = FakeClock()
    arms = {"fast": clock.arm("fast", [0.0625] * 1000), "slow": clock.arm("slow", [0.5] * 1000)}
    out = measure(arms, LatencyProtocol(warmup=3, min_count=4, min_seconds=1.0), CPU, batch=2, clock=clock)
    # warm-up: 3 calls each, interleaved, none of them timed
    assert clock.calls[:6] == ["fast", "slow"] * 3
    # slow: 4 calls reach the count, 2 s > 1 s; fast: 1/16 s a call needs 16 calls for 1 s
    assert len(out["slow"].seconds) == 4 and len(out["fast"].seconds) == 16
    assert clock.calls.count("fast") == 19 and clock.calls.count("slow") == 7
    # interleaved while both run: each round calls each arm once
    assert clock.calls[6:14] == ["fast", "slow"] * 4
    assert out["fast"].warmup_seconds == pytest.approx(0.1875) and out["slow"].warmup_seconds == pytest.approx(1.5)
    m = out["slow"].metrics()
    assert m["latency_per_sample_median"] == pytest.approx(0.25) and m["latency_batch"] == 2
    assert m["latency_cv_pct"] == 0 and m["latency_noisy"] == 0


def test_max_count_stops_an_arm_that_never_reaches_the_time_floor():
    clock = FakeClock()
    out = measure({"a": clock.arm("a", [1e-6] * 100)}, LatencyProtocol(warmup=0, min_count=2, min_seconds=10,
                                                                          max_count=7), CPU, batch=1, clock=clock)
    assert len(out["a"].seconds) == 7 and clock.calls == ["a"] * 7


def test_a_noisy_arm_is_flagged():
    clock = FakeClock()
    steady = [0.1] * 10
    noisy = [0.1, 0.3] * 5  # CV 50 %
    out = measure({"steady": clock.arm("s", steady), "noisy": clock.arm("n", noisy)},
                  LatencyProtocol(warmup=0, min_count=10, min_seconds=0), CPU, batch=1, clock=clock)
    assert not out["steady"].noisy and out["noisy"].noisy
    assert out["noisy"].cv == pytest.approx(50.0)
    assert out["noisy"].metrics()["latency_noisy"] == 1.0


@pytest.mark.parametrize("kwargs", [{"warmup": -1}, {"min_count": 0}, {"min_count": 5, "max_count": 4},
                                    {"min_seconds": float("nan")}, {"cv_bound": 0}])
def test_invalid_protocols_are_one_line(kwargs):
    with pytest.raises(UserError) as err:
        LatencyProtocol(**kwargs)
    assert "\n" not in str(err.value)


def test_the_spread_that_flags_a_wall_speed_up_is_per_forward_pass():
    """A speculative sampler's batches take as long as their passes: SJD at batch 1 spreads 10-20 % per sample on an
    idle machine. Its time per pass is what a busy machine moves, and what the noisy flag reads."""
    from collections import Counter

    from bench.runner import ArmResult, _arm_metrics

    passes = [20, 30, 40, 25]
    r = ArmResult(None, [0.01 * p for p in passes], [1] * 4, [0] * 4, Counter(nfe=sum(passes), tokens=256),
                  [64 / p for p in passes], passes)
    m = _arm_metrics(r, 4)
    assert m["sec_per_sample_cv_pct"] > 10 and m["sec_per_pass_cv_pct"] < 1e-9
