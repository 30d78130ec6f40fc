"""On-install profiling drops a rung only on a slowdown that holds across interleaved rounds,
never on one burst of other work: a fake clock and models whose runs cost fake time."""

from __future__ import annotations

from types import SimpleNamespace

from edgesdk.agent.profiling import measure_variants, speed_ladder


class FakeClock:
    """Milliseconds of fake time; a run started while ``busy`` says so costs ``slowdown`` times more."""

    def __init__(self, busy: tuple[float, float] | None = None, slowdown: float = 3.0) -> None:
        self.now_ms = 0.0
        self.busy, self.slowdown = busy, slowdown

    def __call__(self) -> float:
        return self.now_ms / 1000.0

    def spend(self, ms: float) -> None:
        loaded = self.busy is not None and self.busy[0] <= self.now_ms < self.busy[1]
        self.now_ms += ms * (self.slowdown if loaded else 1.0)


class TimedModel:
    def __init__(self, clock: FakeClock, ms: float) -> None:
        self.clock, self.ms = clock, ms

    def run(self, feeds: object) -> None:
        self.clock.spend(self.ms)

    def close(self) -> None:
        pass


def _ladder(clock: FakeClock, int8_ms: float) -> tuple[list[str], dict[str, str]]:
    cost = {"fp32": 10.0, "int8": int8_ms}
    variants = [SimpleNamespace(id=v, runtime="onnxruntime", precision=v, format="onnx") for v in cost]
    measured, failed = measure_variants(
        variants, lambda vid: TimedModel(clock, cost[vid]), {"x": [0.0]},
        warmup=0, runs=30, rss_mb=lambda: 0.0, clock=clock,
    )  # fmt: skip
    assert not failed
    return speed_ladder(measured)


def test_one_burst_of_load_while_int8_is_timed_does_not_drop_its_rung() -> None:
    # The device is busy for 540 ms of fake time from when 30 fp32 runs (300 ms) are done: timed in
    # one block, every int8 run fell in it, and int8 (6 ms idle) read 18 ms, "no faster than fp32".
    ladder, not_steps = _ladder(FakeClock(busy=(300.0, 840.0)), int8_ms=6.0)
    assert ladder == ["fp32", "int8"], not_steps


def test_an_int8_slower_in_every_round_still_loses_its_rung() -> None:
    ladder, not_steps = _ladder(FakeClock(), int8_ms=12.0)
    assert ladder == ["fp32"] and "no faster than fp32" in not_steps["int8"]
