from __future__ import annotations

from warmfleet_daemon.engine.stops import StopStringFilter


def run(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    f = StopStringFilter(stops)
    out = []
    for piece in pieces:
        text, stopped = f.feed(piece)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + f.flush(), False


def test_stop_string_split_across_pieces_is_caught_and_not_emitted() -> None:
    assert run(["END"], ["hello E", "N", "D tail"]) == ("hello ", True)


def test_partial_match_that_does_not_complete_is_released() -> None:
    assert run(["END"], ["E", "N", "x"]) == ("ENx", False)
    assert run(["END"], ["abc E"]) == ("abc E", False)


def test_earliest_of_several_stops_wins() -> None:
    assert run(["world", "lo"], ["hello world"]) == ("hel", True)


def test_no_stops_passes_everything_through() -> None:
    assert run([], ["a", "b"]) == ("ab", False)
