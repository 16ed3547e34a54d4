"""The coordinator address list (`--coordinator H1:P1,H2:P2`, config `coordinator`,
`artemis loadtest --coordinator`): one parser, a clear error naming a bad entry."""

from __future__ import annotations

import pytest
from artemis.agent.config import AgentConfig
from artemis.common.tomlfile import ConfigError
from artemis.protocol.addresses import AddressListError, expand, parse_address_list
from artemis.sim.loadtest import LoadSpec


def test_a_list_keeps_its_order_and_drops_repeats() -> None:
    assert parse_address_list("c1:7470, c2:7471,c1:7470,[::1]:7472") == (
        "c1:7470",
        "c2:7471",
        "[::1]:7472",
    )
    assert parse_address_list("127.0.0.1:7470") == ("127.0.0.1:7470",)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("c1:7470,,c2:7471", "entry 2"),
        ("c1:7470,c2", "'c2'"),
        ("c1:0", "'c1:0'"),
        ("c1:7470,c2:port", "'c2:port'"),
        (":7470", "':7470'"),
        ("", "expected HOST:PORT"),
    ],
)
def test_a_bad_entry_is_named(text: str, named: str) -> None:
    with pytest.raises(AddressListError, match=named):
        parse_address_list(text)


def test_the_agent_config_and_loadtest_refuse_the_same_entry() -> None:
    with pytest.raises(ConfigError, match="'c2:x'"):
        AgentConfig(coordinator="c1:7470,c2:x").validated()
    assert AgentConfig(coordinator="c1:7470,c2:7471").validated().coordinators == (
        "c1:7470",
        "c2:7471",
    )
    with pytest.raises(ValueError, match="'c2:x'"):
        LoadSpec(
            coordinator="c1:7470,c2:x", secret=b"s" * 32, ranks=1, ranks_per_agent=1, windows=1
        )


def test_a_name_becomes_every_address_it_resolves_to() -> None:
    # localhost resolves on every machine; each of its addresses keeps the port.
    got = expand(["localhost:7470", "10.0.0.1:7471"])
    assert got[-1] == "10.0.0.1:7471"
    assert got[:-1] and all(a.endswith(":7470") and "localhost" not in a for a in got[:-1])
    # a name that does not resolve stays, for the connect attempt to report
    assert expand(["no-such-host.invalid:7470"]) == ["no-such-host.invalid:7470"]
