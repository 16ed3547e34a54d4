"""Settings bounds stated as msgspec.Meta on field types (common/bounds.py), and the
errors the config classes raise from them: each names the key and what is allowed."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from artemis.agent.config import AgentConfig
from artemis.common.bounds import FLOAT_MAX, Bound, out_of_bounds
from artemis.common.tomlfile import ConfigError
from artemis.coordinator.config import CoordinatorConfig, RetentionConfig
from msgspec import Meta


@pytest.mark.parametrize(
    ("tp", "words"),
    [
        (Annotated[float, Meta(gt=1.5, le=FLOAT_MAX)], "a number greater than 1.5"),
        (Annotated[float, Meta(ge=0.0, le=FLOAT_MAX)], "a number of at least 0"),
        (Annotated[float, Meta(gt=0)], "a number greater than 0"),
        (Annotated[int, Meta(ge=2)], "an integer of at least 2"),
        (Annotated[float, Meta(ge=0, lt=1)], "a number in [0, 1)"),
        (Annotated[int, Meta(ge=0, le=65535)], "an integer in [0, 65535]"),
        (Literal["off", "on"], "one of off, on"),
        (
            Annotated[Annotated[int, Meta(ge=1)] | None, Meta(description="a count or none")],
            "a count or none",
        ),
    ],
)
def test_the_words_come_from_the_bound(tp: object, words: str) -> None:
    assert Bound.of(tp).describe() == words


def test_msgspec_checks_the_bound() -> None:
    finite = Bound.of(Annotated[float, Meta(ge=0, le=FLOAT_MAX)])
    assert finite.hi is None  # FLOAT_MAX only says "finite"
    assert finite.problem(0.0) == "" and finite.problem(3) == ""
    for bad in (-1e-9, float("nan"), float("inf"), True, "1"):
        assert finite.problem(bad) == "a number of at least 0", bad
    count = Bound.of(Annotated[Annotated[int, Meta(ge=1)] | None, Meta(description="x")])
    assert count.optional and count.problem(None) == "" and count.problem(0) == "x"
    assert Bound.of(Annotated[int, Meta(ge=1)]).problem(1.0)  # a float is not an integer


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        (CoordinatorConfig(metrics_port=70000), "metrics_port: expected an integer in [0, 65535]"),
        (CoordinatorConfig(assembly_deadline_s=0.0), "assembly_deadline_s: expected a number"),
        (
            CoordinatorConfig(store_queue_max=0),
            "store_queue_max: expected an integer of at least 1",
        ),
        (CoordinatorConfig(store_retry_max_s=-1.0), "store_retry_max_s"),
        (CoordinatorConfig(retention=RetentionConfig(keep_files=0)), "retention.keep_files"),
        (CoordinatorConfig(retention=RetentionConfig(max_age_days=-1.0)), "(0 = no limit)"),
        (AgentConfig(window_steps=1), "window_steps: expected an integer of at least 2, got 1"),
        (AgentConfig(heartbeat_s=0.0), "heartbeat_s"),
        (AgentConfig(uplink_stall_s=-1.0), "uplink_stall_s"),
        (AgentConfig(metrics_port=-1), "metrics_port"),
    ],
)
def test_config_errors_name_the_key(cfg: CoordinatorConfig | AgentConfig, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        cfg.validated()
    assert needle in str(e.value)


def test_defaults_and_edges_are_allowed() -> None:
    CoordinatorConfig().validated()
    AgentConfig().validated()
    AgentConfig(uplink_stall_s=0.0, metrics_port=65535, window_steps=2).validated()
    RetentionConfig(jsonl_max_mb=0.0, max_age_days=0.0, dumps_max_mb=0.0).validated()
    assert out_of_bounds(AgentConfig(), {}) == ""
