"""The W3C trace context headers the HTTP server keeps in a job's meta."""

from __future__ import annotations

import pytest

from ferryq.tracecontext import MAX_TRACESTATE, carried, valid_traceparent

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    "value",
    [PARENT, f"01-{TRACE}-00f067aa0ba902b7-00", f"00-{TRACE}-00f067aa0ba902b7-03"],
)
def test_a_valid_traceparent_is_kept(value: str) -> None:
    assert valid_traceparent(value)
    assert carried([value]) == {"traceparent": value}


@pytest.mark.parametrize(
    "value",
    [
        "",
        f"00-{TRACE.upper()}-00f067aa0ba902b7-01",  # upper-case hex
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # an all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # an all-zero parent id
        f"ff-{TRACE}-00f067aa0ba902b7-01",  # the forbidden version
        f"00-{TRACE}-00f067aa0ba902b7-01-extra",
        f"00-{TRACE[:-1]}-00f067aa0ba902b7-01",
        f"00_{TRACE}_00f067aa0ba902b7_01",
        f"00-{TRACE}-00f067aa0ba902b7-01\n",
    ],
)
def test_an_invalid_traceparent_is_ignored_with_its_tracestate(value: str) -> None:
    assert carried([value], ["congo=t61rcWkgMzE"]) is None


def test_a_repeated_traceparent_is_ignored_and_repeated_tracestates_join() -> None:
    assert carried([PARENT, PARENT]) is None
    assert carried([], ["congo=1"]) is None
    assert carried([f" {PARENT}\t"], ["congo=1 , ", "rojo=2"]) == {
        "traceparent": PARENT,
        "tracestate": "congo=1,rojo=2",
    }


@pytest.mark.parametrize(
    "tracestate",
    [
        "Congo=1",  # upper-case key
        "congo=1,congo=2",  # a key twice
        "congo",  # no value
        "congo=a=b",  # '=' in a value
        "congo=é",  # not ASCII
        "congo=a\tb",  # a tab in a value
        ",".join(f"k{n}=v" for n in range(33)),  # more than 32 members
    ],
)
def test_an_invalid_tracestate_is_dropped_and_the_traceparent_kept(tracestate: str) -> None:
    assert carried([PARENT], [tracestate]) == {"traceparent": PARENT}


def test_a_tenant_key_and_an_empty_tracestate() -> None:
    assert carried([PARENT], ["fw529a3039@dt=value,ab0-*/_=x"])["tracestate"] == (  # type: ignore[index]
        "fw529a3039@dt=value,ab0-*/_=x"
    )
    assert carried([PARENT], [""]) == {"traceparent": PARENT}


def test_a_long_tracestate_loses_its_long_members_first_then_its_last() -> None:
    long = "big=" + "x" * 200
    small = [f"k{n}=" + "v" * 40 for n in range(14)]  # 43 or 44 characters each
    kept = carried([PARENT], [",".join([small[0], long, *small[1:]])])
    assert kept is not None
    assert kept["tracestate"] == ",".join(small[:11])  # 484 characters: one more is 529
    assert len(kept["tracestate"]) <= MAX_TRACESTATE
