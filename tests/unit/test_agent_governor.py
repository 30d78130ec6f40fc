"""The precision governor: the transition table, hysteresis and dwell, battery policy,
firmware throttling, and every sensor source (against fake sysfs trees and commands)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from edgesdk.agent.events import EventBus
from edgesdk.agent.governor.machine import TRANSITIONS, Action, GovernorEvent, PrecisionStateMachine, Rung, State
from edgesdk.agent.governor.runner import Governor
from edgesdk.agent.governor.sensors import (
    CompositeSource,
    JetsonSource,
    SensorReading,
    SysfsThermalSource,
    TraceSource,
    VcgencmdSource,
    make_source,
    parse_nvpmodel,
    parse_throttled,
)
from edgesdk.agent.serving import ModelServer

from edgesdk.errors import ConfigError
from edgesdk.profiles import get_profile
from edgesdk.schemas.common import Precision
from edgesdk.schemas.profile import Power, Thermal

THERMAL = Thermal(sensor_hint="t", throttle_c=80, critical_c=85, step_down_c=76, step_up_c=67, min_dwell_s=10)
LADDER = [Rung("fp32", Precision.FP32), Rung("fp16", Precision.FP16), Rung("int8", Precision.INT8)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def machine(power: Power | None = None) -> tuple[PrecisionStateMachine, Clock]:
    clock = Clock()
    m = PrecisionStateMachine(THERMAL, power or Power(), clock=clock)
    m.model_changed(LADDER)
    return m, clock


def hot(t: float, power: str = "ac") -> SensorReading:
    return SensorReading(temperatures_c={"soc": t}, power_source=power)  # type: ignore[arg-type]


def test_every_table_row_is_reachable_and_well_formed() -> None:
    for (state, event), (action, next_state) in TRANSITIONS.items():
        assert isinstance(state, State) and isinstance(event, GovernorEvent)
        assert isinstance(action, Action) and isinstance(next_state, State)
    assert {s for s, _ in TRANSITIONS} == set(State)
    assert {n for _, n in TRANSITIONS.values()} == set(State) - {State.STARTING}


# (seconds since start, temperature, power) → expected (state, variant) after the reading.
SCENARIOS = {
    "steps down before throttle, one rung per dwell": [
        (0, 70, "ac", State.NOMINAL, "fp32"),
        (1, 77, "ac", State.STEPPED_DOWN, "fp16"),
        (2, 78, "ac", State.STEPPED_DOWN, "fp16"),  # dwell holds
        (12, 78, "ac", State.STEPPED_DOWN, "int8"),
        (30, 79, "ac", State.STEPPED_DOWN, "int8"),  # floor holds
    ],
    "hysteresis band holds, cool steps up after dwell": [
        (0, 77, "ac", State.STEPPED_DOWN, "fp16"),
        (20, 70, "ac", State.STEPPED_DOWN, "fp16"),  # between step_up and step_down: hold
        (21, 66, "ac", State.NOMINAL, "fp32"),
    ],
    "no oscillation faster than the dwell": [
        (0, 77, "ac", State.STEPPED_DOWN, "fp16"),
        (1, 60, "ac", State.STEPPED_DOWN, "fp16"),
        (5, 60, "ac", State.STEPPED_DOWN, "fp16"),
        (10, 60, "ac", State.NOMINAL, "fp32"),
        (11, 77, "ac", State.NOMINAL, "fp32"),
        (20, 77, "ac", State.STEPPED_DOWN, "fp16"),
    ],
    "throttle point steps down at once, dwell or not": [
        (0, 77, "ac", State.STEPPED_DOWN, "fp16"),
        (1, 81, "ac", State.STEPPED_DOWN, "int8"),
    ],
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_thermal_scenarios(name: str) -> None:
    m, clock = machine()
    start = clock.now
    for at, temp, power, state, variant in SCENARIOS[name]:
        clock.now = start + at
        m.update(hot(temp, power))
        assert (m.state, m.current) == (state, variant), (name, at)


def test_battery_policy_caps_and_returns() -> None:
    m, clock = machine(Power(battery=True, on_battery_max_precision=Precision.INT8))
    switch = m.update(hot(60, "battery"))
    assert (m.state, m.current) == (State.POWER_SAVE, "int8")
    assert switch is not None and "on battery" in switch.reason
    clock.now += 1
    m.update(hot(60, "ac"))  # back on mains: the cap lifts, steps up one rung per dwell
    assert m.state == State.STEPPED_DOWN and m.current == "int8"
    clock.now += 10
    m.update(hot(60, "ac"))
    assert m.current == "fp16"
    clock.now += 10
    m.update(hot(60, "ac"))
    assert (m.state, m.current) == (State.NOMINAL, "fp32")


def test_battery_cap_above_the_ladder_is_nominal_power_save() -> None:
    m, _ = machine(Power(battery=True, on_battery_max_precision=Precision.FP32))
    assert m.update(hot(60, "battery")) is None
    assert (m.state, m.current) == (State.POWER_SAVE, "fp32")
    m.update(hot(77, "battery"))
    assert (m.state, m.current) == (State.SAVE_STEPPED_DOWN, "fp16")


def test_firmware_throttling_bits_step_down_at_once() -> None:
    m, _ = machine()
    reading = SensorReading(temperatures_c={"soc": 60}, throttled={"soft_temp_limit": True})
    switch = m.update(reading)
    assert switch is not None and "soft_temp_limit" in switch.reason
    assert m.current == "fp16"


def test_no_readings_change_nothing() -> None:
    m, _ = machine()
    assert m.update(SensorReading()) is None
    assert m.state == State.NOMINAL


def test_governor_runner_applies_switches_to_the_server() -> None:
    from tests.unit.test_agent_serving import FakeModel, variant

    class Script:
        name = "script"

        def __init__(self) -> None:
            self.readings = [hot(60), hot(79), RuntimeError("sensor gone"), hot(60)]

        def read(self) -> SensorReading:
            item = self.readings.pop(0)
            if isinstance(item, Exception):
                raise item
            return item

    events = EventBus()
    seen = []
    events.subscribe(lambda n, d: seen.append(n))
    server = ModelServer(events=events)
    governor = Governor(server, Script(), get_profile("rpi5-8gb"), events=events, min_dwell_s=0)
    server.serve(
        name="m",
        version="1",
        release=1,
        variants=[(variant("fp32", "fp32"), FakeModel(1)), (variant("int8", "int8"), FakeModel(2))],
    )
    assert governor.tick() is None
    switch = governor.tick()
    assert switch is not None and switch.to == "int8" and server.running_model().variant == "int8"
    assert governor.tick() is None  # a failing sensor is logged, nothing changes
    assert governor.tick().to == "fp32"
    assert server.switch_count == 2 and seen.count("precision_switch") == 2
    assert governor.status()["state"] == "NOMINAL"


# -- sensors -------------------------------------------------------------------------------------


def fake_zone(root: Path, n: int, kind: str, millideg: str) -> None:
    zone = root / f"thermal_zone{n}"
    zone.mkdir(parents=True)
    (zone / "type").write_text(kind + "\n")
    (zone / "temp").write_text(millideg + "\n")


def test_sysfs_thermal_zones(tmp_path) -> None:
    fake_zone(tmp_path, 0, "cpu-thermal", "48312")
    fake_zone(tmp_path, 1, "gpu-thermal", "51000")
    fake_zone(tmp_path, 2, "broken", "garbage")
    fake_zone(tmp_path, 3, "bogus", "-273000")
    source = SysfsThermalSource(tmp_path)
    assert source.available()
    assert source.read().temperatures_c == {"cpu-thermal": 48.312, "gpu-thermal": 51.0}
    assert not SysfsThermalSource(tmp_path / "none").available()


def test_vcgencmd_bits_and_temperature() -> None:
    assert parse_throttled("throttled=0x50005") == {
        "under_voltage": True,
        "arm_freq_capped": False,
        "throttled": True,
        "soft_temp_limit": False,
        "under_voltage_occurred": True,
        "arm_freq_capped_occurred": False,
        "throttled_occurred": True,
        "soft_temp_limit_occurred": False,
    }
    answers = {"get_throttled": "throttled=0x8\n", "measure_temp": "temp=71.4'C\n"}
    reading = VcgencmdSource(runner=lambda argv: answers[argv[1]]).read()
    assert reading.temperatures_c == {"soc": 71.4}
    assert reading.firmware_throttling
    with pytest.raises(OSError, match="unexpected vcgencmd output"):
        VcgencmdSource(runner=lambda argv: "VCHI initialization failed").read()


def test_jetson_rails_zones_and_nvpmodel(tmp_path) -> None:
    fake_zone(tmp_path / "class" / "thermal", 0, "CPU-therm", "55500")
    hwmon = tmp_path / "bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
    hwmon.mkdir(parents=True)
    (hwmon / "in1_label").write_text("VDD_IN\n")
    (hwmon / "in1_input").write_text("5000\n")
    (hwmon / "curr1_input").write_text("1200\n")
    iio = tmp_path / "bus/i2c/drivers/ina3221x/6-0040/iio:device0"
    iio.mkdir(parents=True)
    (iio / "rail_name_0").write_text("POM_5V_GPU\n")
    (iio / "in_power0_input").write_text("812\n")
    source = JetsonSource(tmp_path, runner=lambda argv: "NV Power Mode: 15W\n2\n")
    reading = source.read()
    assert reading.temperatures_c == {"CPU-therm": 55.5}
    assert reading.rails_mw == {"VDD_IN": 6000.0, "POM_5V_GPU": 812.0}
    assert reading.power_mode == "15W"
    assert parse_nvpmodel("garbage") is None


def test_trace_source_plays_a_script(tmp_path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "# a comment\n"
        + json.dumps({"at_s": 0, "temperatures_c": {"soc": 50}, "power_source": "ac"})
        + "\n"
        + json.dumps({"at_s": 5, "temperatures_c": {"soc": 79}, "power_source": "battery", "battery_percent": 40})
        + "\n"
    )
    clock = Clock()
    source = TraceSource(trace, clock=clock)
    assert source.read().temperatures_c == {"soc": 50}
    clock.now += 6
    reading = source.read()
    assert (reading.hottest_c, reading.power_source, reading.battery_percent) == (79, "battery", 40)
    clock.now += 600
    assert source.read().hottest_c == 79  # the last entry holds


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "no entries"),
        ('{"temperatures_c": {}}', "at_s"),
        ('{"at_s": 0, "temp": 5}', "unknown field"),
        ('{"at_s": 0, "power_source": "solar"}', "solar"),
        ("not json", "line 1"),
    ],
)
def test_bad_trace_files(tmp_path, text, needle) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        TraceSource(trace)


def test_composite_merges_and_survives_failures() -> None:
    class Fails:
        name = "fails"

        def read(self) -> SensorReading:
            raise OSError("i2c timeout")

    class Temps:
        name = "temps"

        def read(self) -> SensorReading:
            return SensorReading(temperatures_c={"a": 40.0}, power_source="ac")

    class Battery:
        name = "battery"

        def read(self) -> SensorReading:
            return SensorReading(temperatures_c={"b": 45.0}, power_source="unknown", battery_percent=80.0)

    reading = CompositeSource([Fails(), Temps(), Battery()]).read()
    assert reading.temperatures_c == {"a": 40.0, "b": 45.0}
    assert reading.power_source == "ac" and reading.battery_percent == 80.0


def test_make_source_errors() -> None:
    with pytest.raises(ConfigError, match="trace_file"):
        make_source("trace")
    pytest.importorskip("psutil")
    assert make_source("psutil").sources
