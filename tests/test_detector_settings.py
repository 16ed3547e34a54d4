"""Settings: defaults, string parsing, TOML mappings and clear errors."""

from __future__ import annotations

import pytest
from artemis.detect.settings import Settings, SettingsError


def test_defaults_match_the_design() -> None:
    s = Settings()
    assert (s.suspect_ratio, s.flag_after, s.flag_window) == (1.10, 3, 4)
    assert (s.clear_after, s.warmup_windows, s.min_island_peers) == (3, 5, 3)
    assert (s.hardware_classes, s.rebalance, s.gpu_count) == ("auto", "off", None)
    assert (s.hang_floor_s, s.hang_step_factor) == (10.0, 20.0)


@pytest.mark.parametrize(
    ("key", "text", "expected"),
    [
        ("suspect_ratio", "1.25", 1.25),
        ("flag_after", " 2 ", 2),
        ("hardware_classes", "ON", "on"),
        ("hardware_classes", "true", "on"),
        ("hardware_classes", "false", "off"),
        ("rebalance", "recommend", "recommend"),
        ("gpu_count", "64", 64),
        ("gpu_count", "none", None),
        ("hang_floor_s", "3", 3.0),
        ("min_plan_interval_windows", "0", 0),
    ],
)
def test_set_parses_strings(key: str, text: str, expected: object) -> None:
    base = Settings()
    new = base.set(key, text)
    assert getattr(new, key) == expected
    assert type(getattr(new, key)) is type(expected)
    # set returns a copy; the original is unchanged.
    assert getattr(base, key) == getattr(Settings(), key)


@pytest.mark.parametrize(
    ("key", "text", "allowed"),
    [
        ("suspect_ratio", "0.9", "greater than 1.0"),
        ("suspect_ratio", "fast", "greater than 1.0"),
        ("suspect_ratio", "nan", "greater than 1.0"),
        ("flag_after", "0", "at least 1"),
        ("flag_after", "2.5", "at least 1"),
        ("flag_after", "9", "flag_window"),
        ("hardware_classes", "maybe", "auto, on, off"),
        ("rebalance", "yes", "off, recommend, apply"),
        ("min_island_peers", "1", "at least 2"),
        ("max_shift_frac", "1.5", "[0, 1)"),
        ("max_shift_frac", "1.0", "[0, 1)"),  # the policy's bound (rebalance.policy.BOUNDS)
        ("gpu_count", "0", "positive integer"),
        ("hang_floor_s", "-1", "greater than 0"),
    ],
)
def test_bad_values_name_key_value_and_allowed(key: str, text: str, allowed: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings().set(key, text)
    msg = str(err.value)
    assert key in msg
    assert text.strip() in msg
    assert allowed in msg


def test_unknown_key_lists_allowed_keys() -> None:
    with pytest.raises(SettingsError, match=r"unknown setting 'suspect'.*suspect_ratio"):
        Settings().set("suspect", "1.2")
    with pytest.raises(SettingsError, match="unknown setting 'bogus'"):
        Settings.from_mapping({"bogus": 1})


def test_from_mapping_accepts_native_toml_values() -> None:
    s = Settings.from_mapping(
        {"hardware_classes": True, "suspect_ratio": 1.2, "drift_ratio": 2, "rebalance": "apply"}
    )
    assert s.hardware_classes == "on" and s.suspect_ratio == 1.2
    assert s.drift_ratio == 2.0 and isinstance(s.drift_ratio, float)
    assert s.rebalance == "apply"
    assert Settings.from_mapping({"hardware_classes": False}).hardware_classes == "off"


def test_from_mapping_rejects_wrong_types() -> None:
    with pytest.raises(SettingsError, match="flag_after"):
        Settings.from_mapping({"flag_after": 2.5})
    with pytest.raises(SettingsError, match="suspect_ratio"):
        Settings.from_mapping({"suspect_ratio": True})
    with pytest.raises(SettingsError, match="rebalance"):
        Settings.from_mapping({"rebalance": 3})


def test_direct_construction_is_validated_too() -> None:
    with pytest.raises(SettingsError, match="clear_after"):
        Settings(clear_after=0)


def test_every_key_is_described_and_round_trips() -> None:
    s = Settings(gpu_count=16, hardware_classes="on")
    for key in Settings.names():
        assert Settings.describe(key)
    assert Settings.from_mapping(s.to_dict()) == s
