"""``pipeplan reproduce``: the quick report's structure, every number it shows is in results.json, and
the plans it measures ran beside their predictions.

The quick report runs once (:func:`quick`), its calls of
:func:`pipeplan.experiments.claims.runs.measure_plans` recorded; ``tests/test_reproduce_runs.py``
tests the rest of the measured cases' code.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys

import pytest

from pipeplan.experiments.claims import CLAIMS, runs as claim_runs
from pipeplan.experiments.reproduce import report, select
from pipeplan.experiments.claims.common import Row, Section

NUMBER = re.compile(r"(?<![A-Za-z0-9_.\-])[-+]?\d+(?:\.\d+)?(?![A-Za-z0-9_@\-])")
"""A number in prose or a table cell; digits inside names (gpt1-14, 1F1B, 0-4@g0) are not numbers."""


def numbers_in(text: str) -> list[str]:
    return NUMBER.findall(text)


def json_numbers(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, dict):
        return [x for v in value.values() for x in json_numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in json_numbers(v)]
    return []


def shown_by(token: str, values: list[float]) -> bool:
    """Whether some value rounds to ``token`` at the token's precision."""
    digits = len(token.split(".")[1]) if "." in token else 0
    x = float(token)
    return any(abs(v - x) <= 0.5 * 10 ** -digits + 1e-9 for v in values)


class TestNumberPattern:
    def test_names_are_not_numbers(self):
        assert numbers_in("gpt1-14 on 1F1B, 0-4@g0 | 5-13@g1, vgg16") == []

    def test_numbers_are_found(self):
        assert numbers_in("| 5.38 % | -46.07 % | 1.24× | 36.389 ms | 4 GPUs |") == ["5.38", "-46.07", "1.24", "36.389", "4"]


class TestSelect:
    def test_all_in_report_order(self):
        assert select(None) == list(CLAIMS)
        assert select("exact, umpipe") == ["umpipe", "exact"]

    def test_unknown_name(self):
        from pipeplan.models.errors import InputError

        with pytest.raises(InputError, match="unknown claim 'nope'; the claims are umpipe, autopipe"):
            select("umpipe,nope")
        with pytest.raises(InputError, match="names no claim"):
            select(",")


class TestReport:
    def test_sections_and_numbers(self):
        sec = Section("x", "X claim")
        sec.rows.append(Row("c", sec.num(1.5, 1), sec.num(2.25, 2, "%"), "cond", "why"))
        text = report([sec], quick=True)
        assert "## X claim" in text and "| c | 1.5 | 2.25 % | cond | why |" in text
        assert sec.shown == [1.5, 2.25]


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """``pipeplan reproduce --quick`` in this process: ``(status, stdout, folder, measured)``.

    ``measured`` lists ``(args, kwargs, result)`` of every call of ``measure_plans`` the claims made.
    """
    from pipeplan.cli import main

    out = tmp_path_factory.mktemp("reproduce") / "r"
    measured, real = [], claim_runs.measure_plans

    def recording(*args, **kwargs):
        result = real(*args, **kwargs)
        measured.append((args, kwargs, result))
        return result

    stdout = tmp_path_factory.mktemp("stdout") / "out.txt"
    with pytest.MonkeyPatch.context() as mp:
        for name, module in list(sys.modules.items()):
            if name.startswith("pipeplan.experiments.claims.") and getattr(module, "measure_plans", None) is real:
                mp.setattr(module, "measure_plans", recording)
        with open(stdout, "w") as f, contextlib.redirect_stdout(f):
            status = main(["reproduce", "--quick", "-o", str(out)])
    return status, stdout.read_text(), out, measured


class TestReproduceCommand:
    def test_quick_report(self, quick):
        status, stdout, out, _ = quick
        assert status == 0 and "report.md" in stdout
        text = (out / "report.md").read_text()
        results = json.loads((out / "results.json").read_text())
        assert results["format"] == "pipeplan.reproduce/1" and results["quick"] is True
        assert list(results["claims"]) == list(CLAIMS)
        for name, claim in results["claims"].items():
            assert f"## {claim['title']}" in text and claim["rows"], name
            for fig in claim["figures"]:
                assert (out / fig).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({fig})" in text
        values = json_numbers(results)
        missing = [t for t in numbers_in(text) if not shown_by(t, values)]
        assert missing == []

    def test_unknown_claim_writes_nothing(self, run_cli, tmp_path):
        out = tmp_path / "r"
        status, _, err = run_cli("reproduce", "--only", "nope", "-o", str(out))
        assert status == 2 and err.startswith("error: -: --only: unknown claim 'nope'") and err.count("\n") == 1
        assert not out.exists()

    def test_output_is_a_file(self, run_cli, tmp_path):
        out = tmp_path / "f"
        out.write_text("x")
        status, _, err = run_cli("reproduce", "--only", "exact", "-o", str(out))
        assert status == 2 and "is a file" in err and out.read_text() == "x"


class TestMeasurePlans:
    def test_runs_every_plan_beside_its_prediction(self, quick):
        from pipeplan.runtime.report import without_step
        from pipeplan.runtime.routing import rank_of
        from pipeplan.solver.evaluation.simulator import simulate

        measured = quick[3]
        assert measured, "the quick report measures plans with the runtime"
        for args, kwargs, out in measured:
            plans, graph, cluster, _, runs = args[:5]
            assert list(out) == list(plans)
            for name, m in out.items():
                assert m.processes == len(rank_of(plans[name])) and m.errors == [] and len(m.runs) == runs.repeats
                assert all(t > 0 for t in m.runs) and m.peak > 0
                prediction = simulate(plans[name], graph, cluster)
                assert m.simulated == pytest.approx(without_step(prediction))
                assert m.simulated_peak == pytest.approx(max(prediction.peak_memory))
