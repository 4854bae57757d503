"""A node's worker says it is alive (and what its GPUs report); the fleet page shows it."""

from __future__ import annotations

import pytest

from apps.fleet import liveness

pytestmark = pytest.mark.django_db


def test_a_pulse_names_the_worker_and_lives_three_periods(settings):
    settings.GANTRY_WORKER_PULSE_S = 5
    liveness.publish_pulse(["pulse-node-a"], worker="pool@host-a")
    seen = liveness.pulses(["pulse-node-a", "pulse-node-silent"])
    assert set(seen) == {"pulse-node-a"}
    pulse = seen["pulse-node-a"]
    assert pulse.worker == "pool@host-a" and pulse.age_s() < 5
    ttl = liveness.redis_client().ttl(liveness.KEY.format("pulse-node-a"))
    assert 10 < ttl <= 15


def test_gpu_telemetry_is_none_without_nvidias_driver_and_readings_with_it():
    readings = liveness.gpu_telemetry()
    if readings is None:
        pytest.skip("no NVIDIA driver (NVML) on this machine: telemetry reads None, as shown")
    assert readings and {"utilisation_pct", "memory_total_mib", "temperature_c"} <= set(readings[0])
