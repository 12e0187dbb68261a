"""``fused-llm bench --alternate``: a case's providers timed in turns (timing.time_alternated)
instead of one after the other (timing.time_us). The timing itself needs a GPU; here the two
timers are replaced to check what the harness does with their answers, on a CPU."""

from __future__ import annotations

from fused_llm_dev.bench import run
from fused_llm_dev.bench.settings import Method
from fused_llm_dev.bench.suite import Case, Provider, Suite
from fused_llm_dev.bench.timing import Timing


def _suite() -> Suite:
    providers = [Provider("ours", lambda case, seed: (lambda: None)),
                 Provider("peer", lambda case, seed: (lambda: None), bytes_moved=lambda c: 2 * c["n"]),
                 Provider("broken", lambda case, seed: (lambda: None))]  # fmt: skip
    return Suite("toy", "toy", [Case.of(n=1000)], [Case.of(n=1000)], providers, bytes_moved=lambda c: c["n"])


def test_alternate_times_every_provider_of_a_case_in_one_call(monkeypatch):
    calls = []

    def fake_alternated(makers, sizes, method):
        calls.append((sorted(makers), dict(sizes), method))
        timed = {"ours": Timing(1.0, 0.9, 1.1, 16, 30), "peer": Timing(2.0, 1.9, 2.1, 16, 30)}
        return timed, {"broken": "RuntimeError: capture failed"}

    def no_time_us(*args, **kwargs):
        raise AssertionError("time_us must not run under --alternate")

    monkeypatch.setattr(run, "time_alternated", fake_alternated)
    monkeypatch.setattr(run, "time_us", no_time_us)
    monkeypatch.setattr(run, "_device_ok", lambda: True)
    suite, logged = _suite(), []
    results = run.time_case(suite, suite.cases[0], suite.providers, 100.0, Method(alternate=True), logged.append)
    (names, sizes, method), = calls
    assert names == ["broken", "ours", "peer"] and sizes == {"ours": 1000, "peer": 2000, "broken": 1000}
    assert method.alternate
    by = {r.provider: r for r in results}
    assert (by["ours"].median_us, by["peer"].median_us, by["ours"].samples) == (1.0, 2.0, 30)
    assert by["ours"].gbps == 1000 / 1e-6 / 1e9 and by["broken"].median_us is None
    assert by["broken"].error == "RuntimeError: capture failed" and any("broken" in line for line in logged)


def test_without_alternate_each_provider_is_timed_alone(monkeypatch):
    seen = []

    def fake_time_us(make, nbytes, method):
        seen.append(nbytes)
        return Timing(3.0, 2.9, 3.1, 16, 30)

    monkeypatch.setattr(run, "time_us", fake_time_us)
    suite = _suite()
    results = run.time_case(suite, suite.cases[0], suite.providers, 100.0, Method(), lambda line: None)
    assert seen == [1000, 2000, 1000] and all(r.median_us == 3.0 for r in results)


def test_the_option_reaches_the_method_and_the_file_names():
    parser = run.argparse.ArgumentParser()
    run.add_arguments(parser)
    assert parser.parse_args(["--alternate"]).alternate and not parser.parse_args([]).alternate
