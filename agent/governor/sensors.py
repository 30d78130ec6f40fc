"""Sensor sources behind one interface: ``read() -> SensorReading``.

Sources: sysfs thermal zones (every Linux board), psutil (temperatures, battery, CPU
frequency), the Raspberry Pi firmware's ``vcgencmd get_throttled`` bits, Jetson thermal
zones + INA3221 power rails + ``nvpmodel`` mode, and a scripted trace file for tests and
demos. ``auto`` combines every source present. A source that fails is logged once and the
others carry on: a missing sensor must never stop inference.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Protocol

from edgesdk.errors import ConfigError

log = logging.getLogger("edgesdk.agent.governor")

PowerSource = Literal["ac", "battery", "unknown"]

#: ``vcgencmd get_throttled`` bits (Raspberry Pi firmware documentation).
THROTTLED_BITS = {
    0: "under_voltage",
    1: "arm_freq_capped",
    2: "throttled",
    3: "soft_temp_limit",
    16: "under_voltage_occurred",
    17: "arm_freq_capped_occurred",
    18: "throttled_occurred",
    19: "soft_temp_limit_occurred",
}


@dataclass(frozen=True)
class SensorReading:
    """One look at the device. Empty fields mean 'this source does not know'."""

    temperatures_c: dict[str, float] = field(default_factory=dict)
    power_source: PowerSource = "unknown"
    battery_percent: float | None = None
    cpu_freq_mhz: float | None = None
    throttled: dict[str, bool] = field(default_factory=dict)
    power_mode: str | None = None
    rails_mw: dict[str, float] = field(default_factory=dict)

    @property
    def hottest_c(self) -> float | None:
        return max(self.temperatures_c.values()) if self.temperatures_c else None

    @property
    def firmware_throttling(self) -> bool:
        """The firmware says it is throttling or at its soft temperature limit right now."""
        return bool(self.throttled.get("throttled") or self.throttled.get("soft_temp_limit"))

    def merged(self, other: SensorReading) -> SensorReading:
        """This reading completed by ``other`` (known values of ``self`` win)."""
        return SensorReading(
            temperatures_c={**other.temperatures_c, **self.temperatures_c},
            power_source=self.power_source if self.power_source != "unknown" else other.power_source,
            battery_percent=self.battery_percent if self.battery_percent is not None else other.battery_percent,
            cpu_freq_mhz=self.cpu_freq_mhz if self.cpu_freq_mhz is not None else other.cpu_freq_mhz,
            throttled={**other.throttled, **self.throttled},
            power_mode=self.power_mode or other.power_mode,
            rails_mw={**other.rails_mw, **self.rails_mw},
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "temperatures_c": dict(self.temperatures_c),
            "power_source": self.power_source,
            "battery_percent": self.battery_percent,
            "cpu_freq_mhz": self.cpu_freq_mhz,
            "throttled": dict(self.throttled),
            "power_mode": self.power_mode,
            "rails_mw": dict(self.rails_mw),
        }


class SensorSource(Protocol):
    """Anything that can take a reading."""

    name: str

    def read(self) -> SensorReading:
        """A fresh reading; may raise OSError when the hardware misbehaves."""
        ...


Runner = Callable[[Sequence[str]], str]


def run_command(argv: Sequence[str]) -> str:
    """Run a short sensor command; its stdout (OSError/SubprocessError on failure)."""
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=5, check=True)
    return done.stdout


class SysfsThermalSource:
    """``/sys/class/thermal/thermal_zone*/{type,temp}`` (millidegrees Celsius)."""

    name = "sysfs"

    def __init__(self, root: Path = Path("/sys/class/thermal")) -> None:
        self.root = Path(root)

    def available(self) -> bool:
        return any(self.root.glob("thermal_zone*/temp"))

    def read(self) -> SensorReading:
        temps: dict[str, float] = {}
        for zone in sorted(self.root.glob("thermal_zone*")):
            try:
                raw = (zone / "temp").read_text().strip()
                kind = (zone / "type").read_text().strip() if (zone / "type").exists() else zone.name
            except OSError:
                continue  # some zones refuse reads (disabled sensors)
            if raw.lstrip("-").isdigit():
                value = int(raw) / 1000.0
                if -40.0 < value < 200.0:  # firmware reports nonsense on some boards
                    temps[kind if kind not in temps else zone.name] = value
        return SensorReading(temperatures_c=temps)


class PsutilSource:
    """psutil's temperatures, battery and CPU frequency (whatever this OS exposes)."""

    name = "psutil"

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil

    def read(self) -> SensorReading:
        ps = self._psutil
        temps: dict[str, float] = {}
        sensors = getattr(ps, "sensors_temperatures", None)
        if sensors is not None:
            for chip, entries in (sensors() or {}).items():
                for i, entry in enumerate(entries):
                    if entry.current is not None and -40.0 < entry.current < 200.0:
                        temps[f"{chip}/{entry.label or i}"] = float(entry.current)
        power: PowerSource = "unknown"
        percent = None
        battery = ps.sensors_battery() if hasattr(ps, "sensors_battery") else None
        if battery is not None:
            percent = float(battery.percent)
            if battery.power_plugged is not None:
                power = "ac" if battery.power_plugged else "battery"
        freq = ps.cpu_freq() if hasattr(ps, "cpu_freq") else None
        return SensorReading(
            temperatures_c=temps,
            power_source=power,
            battery_percent=percent,
            cpu_freq_mhz=float(freq.current) if freq else None,
        )


def parse_throttled(text: str) -> dict[str, bool]:
    """``throttled=0x50005`` → {under_voltage: True, throttled: True, ...}."""
    value = text.strip().partition("=")[2] or text.strip()
    try:
        bits = int(value, 16)
    except ValueError as exc:
        raise OSError(f"unexpected vcgencmd output {text.strip()!r}") from exc
    return {name: bool(bits & (1 << bit)) for bit, name in THROTTLED_BITS.items()}


def parse_vcgencmd_temp(text: str) -> float:
    """``temp=48.3'C`` → 48.3."""
    value = text.strip().partition("=")[2].rstrip("'C").strip()
    try:
        return float(value)
    except ValueError as exc:
        raise OSError(f"unexpected vcgencmd output {text.strip()!r}") from exc


class VcgencmdSource:
    """Raspberry Pi firmware: SoC temperature and the throttling bits."""

    name = "vcgencmd"

    def __init__(self, runner: Runner = run_command, binary: str = "vcgencmd") -> None:
        self.runner = runner
        self.binary = binary

    def available(self) -> bool:
        return shutil.which(self.binary) is not None

    def read(self) -> SensorReading:
        try:
            throttled = parse_throttled(self.runner([self.binary, "get_throttled"]))
            temp = parse_vcgencmd_temp(self.runner([self.binary, "measure_temp"]))
        except subprocess.SubprocessError as exc:
            raise OSError(f"vcgencmd failed: {exc}") from exc
        return SensorReading(temperatures_c={"soc": temp}, throttled=throttled)


def parse_nvpmodel(text: str) -> str | None:
    """``nvpmodel -q`` → the mode name (``NV Power Mode: MAXN``)."""
    for line in text.splitlines():
        if "Power Mode" in line and ":" in line:
            return line.split(":", 1)[1].strip()
    return None


class JetsonSource:
    """Jetson: thermal zones, INA3221 power rails (mW) and the nvpmodel power mode."""

    name = "jetson"

    def __init__(self, sys_root: Path = Path("/sys"), runner: Runner = run_command) -> None:
        self.sys_root = Path(sys_root)
        self.runner = runner
        self.thermal = SysfsThermalSource(self.sys_root / "class" / "thermal")

    def available(self) -> bool:
        return (
            Path("/etc/nv_tegra_release").exists() or shutil.which("nvpmodel") is not None
        ) and self.thermal.available()

    def _rails(self) -> dict[str, float]:
        rails: dict[str, float] = {}
        # JetPack 5/6: hwmon under the ina3221 driver: inN_label, inN_input (mV), currN_input (mA).
        for hwmon in self.sys_root.glob("bus/i2c/drivers/ina3221/*/hwmon/hwmon*"):
            for label_file in hwmon.glob("in*_label"):
                index = label_file.name[2:].split("_")[0]
                try:
                    label = label_file.read_text().strip()
                    mv = float((hwmon / f"in{index}_input").read_text())
                    ma = float((hwmon / f"curr{index}_input").read_text())
                except (OSError, ValueError):
                    continue
                rails[label] = round(mv * ma / 1000.0, 1)
        # JetPack 4: iio devices of ina3221x: rail_name_N, in_power N_input (mW).
        for device in self.sys_root.glob("bus/i2c/drivers/ina3221x/*/iio:device*"):
            for name_file in device.glob("rail_name_*"):
                index = name_file.name.rsplit("_", 1)[1]
                try:
                    rails[name_file.read_text().strip()] = float((device / f"in_power{index}_input").read_text())
                except (OSError, ValueError):
                    continue
        return rails

    def read(self) -> SensorReading:
        mode = None
        try:
            mode = parse_nvpmodel(self.runner(["nvpmodel", "-q"]))
        except (OSError, subprocess.SubprocessError):
            mode = None
        thermal = self.thermal.read()
        return SensorReading(temperatures_c=thermal.temperatures_c, rails_mw=self._rails(), power_mode=mode)


class TraceSource:
    """A scripted sensor trace: JSON lines ``{"at_s": 0, "temperatures_c": {...}, "power_source": "ac"}``.

    ``at_s`` counts from the first read; each read returns the last entry whose time has
    come (the last entry holds forever). Any SensorReading field may appear in an entry.
    """

    name = "trace"

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.clock = clock
        self.entries = self.load(self.path)
        self._start: float | None = None

    @staticmethod
    def load(path: Path) -> list[tuple[float, SensorReading]]:
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"sensor trace {str(path)!r} cannot be read: {exc}") from exc
        entries: list[tuple[float, SensorReading]] = []
        known = set(SensorReading.__dataclass_fields__)
        for number, line in enumerate(lines, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                data = json.loads(line)
                at = float(data.pop("at_s"))
                unknown = set(data) - known
                if unknown:
                    raise ValueError(f"unknown field(s) {sorted(unknown)}")
                if data.get("power_source", "unknown") not in ("ac", "battery", "unknown"):
                    raise ValueError(f"power_source {data['power_source']!r} is not ac, battery or unknown")
                reading = SensorReading(**data)
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"sensor trace {str(path)!r} line {number}: {exc}") from exc
            entries.append((at, reading))
        if not entries:
            raise ConfigError(f"sensor trace {str(path)!r} has no entries")
        return sorted(entries, key=lambda e: e[0])

    def read(self) -> SensorReading:
        now = self.clock()
        if self._start is None:
            self._start = now
        elapsed = now - self._start
        current = self.entries[0][1]
        for at, reading in self.entries:
            if at > elapsed:
                break
            current = reading
        return replace(current)


class CompositeSource:
    """Several sources read together; a failing one is logged once and skipped."""

    name = "composite"

    def __init__(self, sources: Sequence[SensorSource]) -> None:
        self.sources = list(sources)
        self._failed: set[str] = set()

    def read(self) -> SensorReading:
        reading = SensorReading()
        for source in self.sources:
            try:
                reading = reading.merged(source.read())
            except Exception as exc:  # noqa: BLE001 - hardware sources fail in many ways
                if source.name not in self._failed:
                    log.warning("sensor source %s failed: %s", source.name, exc)
                    self._failed.add(source.name)
                continue
            self._failed.discard(source.name)
        return reading


def make_source(kind: str, *, trace_file: Path | None = None) -> CompositeSource:
    """The sensor source for ``governor.source`` (auto: every source this device has)."""
    sources: list[SensorSource] = []
    if kind == "trace":
        if trace_file is None:
            raise ConfigError("governor.source = 'trace' needs governor.trace_file")
        return CompositeSource([TraceSource(trace_file)])
    if kind in ("auto", "jetson"):
        jetson = JetsonSource()
        if jetson.available():
            sources.append(jetson)
        elif kind == "jetson":
            raise ConfigError("governor.source = 'jetson' but this is not a Jetson (no nvpmodel / thermal zones)")
    if kind in ("auto", "vcgencmd"):
        vcgencmd = VcgencmdSource()
        if vcgencmd.available():
            sources.append(vcgencmd)
        elif kind == "vcgencmd":
            raise ConfigError("governor.source = 'vcgencmd' but vcgencmd is not on PATH")
    if kind in ("auto", "sysfs") and not any(isinstance(s, JetsonSource) for s in sources):
        sysfs = SysfsThermalSource()
        if sysfs.available() or kind == "sysfs":
            sources.append(sysfs)
    if kind in ("auto", "psutil"):
        try:
            sources.append(PsutilSource())
        except ImportError as exc:
            if kind == "psutil":
                raise ConfigError("governor.source = 'psutil' but psutil is not installed") from exc
    return CompositeSource(sources)
