"""`make demo` runs `artemis demo` with its default scenario: that file must ship (the
CLI's move from sim/ to cli/ once left the default pointing at a folder that does not
exist)."""

from __future__ import annotations

import inspect

from artemis.cli import main


def test_the_demos_default_scenario_ships_with_the_simulator() -> None:
    default = inspect.signature(main.demo).parameters["scenario"].default
    assert default.is_file(), default
    assert default.parent.name == "scenarios" and default.parent.parent.name == "sim"
