"""The command line: ``nbgrad check``, ``nbgrad ops``, ``nbgrad bench``.

Most tests run ``python -m nbgrad`` in a subprocess, as users do; the diagnosis and
shape parsing are also tested in-process. Op selections are kept small (a full
``nbgrad check`` is measured, not tested, here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from click.testing import CliRunner

import nbgrad as nb
from nbgrad.autograd.gradcheck import GradcheckError, compare_jacobians, gradcheck
from nbgrad.cli import cli
from nbgrad.cli.bench import find_perf
from nbgrad.cli.diagnose import constant_factor, diagnose
from nbgrad.cli.errors import CliError
from nbgrad.cli.usercheck import parse_shape

JIT_BUILT = hasattr(nb, "jit")

USER_MODULE = textwrap.dedent('''
    import nbgrad as nb


    class Square(nb.autograd.Function):
        """x * x with a backward off by a factor 2 (4 x instead of 2 x)."""

        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 4.0 * x


    class GoodSquare(Square):
        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * 2.0 * x


    def wrong(x, w):
        return nb.sum(Square.apply(x) * w, dim=-1)


    def right(x, w):
        return nb.sum(GoodSquare.apply(x) * nb.exp(w), dim=-1)


    def plain(x, w):
        return nb.sum(nb.tanh(x) * w, dim=-1)


    NOT_A_FUNCTION = 3
''')


def run_cli(*args: str, cwd=None, isolated_path: bool = False) -> subprocess.CompletedProcess:
    """``python -m nbgrad ARGS``; ``isolated_path`` keeps the current folder off sys.path
    (``python -P``), as for the ``nbgrad`` console script."""
    flags = ["-P"] if isolated_path else []
    return subprocess.run([sys.executable, *flags, "-m", "nbgrad", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert proc.stdout == ""
    return lines[0]


@pytest.fixture
def user_dir(tmp_path):
    (tmp_path / "usermod.py").write_text(USER_MODULE)
    return tmp_path


# ------------------------------------------------------------------ help
@pytest.mark.parametrize("command", [[], ["check"], ["ops"], ["bench"]])
def test_every_command_has_help(command):
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage: " in result.output and "--help" in result.output


def test_python_dash_m_runs_the_cli():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for name in ("check", "ops", "bench"):
        assert name in proc.stdout


# ------------------------------------------------------------------ check OP ...
def test_check_passing_ops_with_second_order():
    proc = run_cli("check", "mul", "exp", "sum", "eq", "--second-order", "--mode", "eager")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for name, samples in (("mul", 5), ("exp", 3), ("sum", 5)):
        assert any(line.split("│")[1].strip() == name and f"pass {samples}/{samples}" in line
                   for line in out.splitlines() if line.count("│") > 3), (name, out)
    assert "not differentiable" in out  # eq
    assert "first order: 3 pass, 0 fail, 1 n/a; second order: 3 pass, 0 fail, 1 n/a" in out
    assert out.rstrip().endswith("OK")


def test_check_json_is_machine_readable():
    proc = run_cli("check", "neg", "tanh", "--json", "--seed", "3")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True and data["options"]["seed"] == 3
    assert [(r["op"], r["mode"]) for r in data["results"]] == [
        ("neg", "eager"), ("neg", "jit"), ("tanh", "eager"), ("tanh", "jit")]
    eager = data["results"][0]
    assert eager["first_order"]["status"] == "pass"
    assert eager["first_order"]["passed"] == eager["samples"] == 3
    assert eager["second_order"]["note"] == "not requested"
    jit = data["results"][1]
    if JIT_BUILT:
        assert jit["first_order"]["status"] == "pass"
    else:
        assert jit["first_order"] == {"status": "n/a", "passed": 0, "total": 0,
                                      "note": "nbgrad.jit not built", "failures": []}
        assert data["jit_built"] is False


def test_check_jobs_float32_and_fast():
    proc = run_cli("check", "sin", "mul", "sum", "div", "--jobs", "2", "--mode", "eager",
                   "--dtype", "float32", "--fast", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning: checking in float32" in proc.stderr
    data = json.loads(proc.stdout)
    assert [r["op"] for r in data["results"]] == ["sin", "mul", "sum", "div"]
    assert all(r["tolerances"]["atol"] >= 1e-4 for r in data["results"])
    assert data["summary"]["first_order"]["pass"] == 4


def test_check_uses_every_core_up_to_four_by_default(monkeypatch):
    from nbgrad.cli import opcheck
    expected = min(len(os.sched_getaffinity(0)), 4)
    monkeypatch.setattr(opcheck.os, "sched_getaffinity", lambda pid: set(range(8)))
    assert opcheck.auto_jobs() == opcheck.MAX_AUTO_JOBS == 4
    monkeypatch.setattr(opcheck.os, "sched_getaffinity", lambda pid: {0})
    assert opcheck.auto_jobs() == 1
    proc = run_cli("check", "sin", "exp", "--mode", "eager", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["options"]["jobs"] == expected


def test_check_reports_a_wrong_derivative_as_failure(monkeypatch):
    # In-process: the exp record now calls an exp whose backward is off by a factor 2.
    import dataclasses

    import nbgrad.testing
    from nbgrad.cli.opcheck import CheckOptions, check_op

    class BadExp(nb.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = nb.exp(x)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            return 2.0 * g * y

    records = dict(nbgrad.testing.all_records())
    records["exp"] = dataclasses.replace(records["exp"], call=BadExp.apply)
    monkeypatch.setattr(nbgrad.testing, "all_records", lambda: records)
    (row,) = check_op("exp", CheckOptions(modes=("eager",)))
    assert row["first_order"]["status"] == "fail"
    assert row["first_order"]["passed"] == 0 and row["first_order"]["total"] == 3
    assert "Jacobian mismatch" in row["first_order"]["failures"][0]["message"]


# ------------------------------------------------------------------ check MODULE:FUNCTION
def test_user_function_off_by_factor_two_fails_with_diagnosis(user_dir):
    proc = run_cli("check", "usermod:wrong", "--shape", "3,4", "--shape", "4", "--mode",
                   "eager", cwd=user_dir, isolated_path=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "input 0 (shape (3, 4))" in out
    assert "12 of 36 Jacobian entries differ" in out
    assert "analytic" in out and "numeric" in out and "difference" in out
    assert "likely cause: the analytic gradient is off by a constant factor 2.0" in out
    assert "input 1" not in out  # w's gradient is right
    assert out.rstrip().endswith("FAILED")


def test_user_function_json_and_second_order(user_dir):
    proc = run_cli("check", "usermod:right", "--shape", "2,3", "--shape", "3",
                   "--domain", "positive", "--second-order", "--json", "--mode", "eager",
                   cwd=user_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["ok"] is True and data["domains"] == ["positive", "positive"]
    (eager,) = data["results"]
    assert eager["mode"] == "eager"
    assert eager["first_order"]["status"] == eager["second_order"]["status"] == "pass"

    proc = run_cli("check", "usermod:wrong", "--shape", "2,3", "--shape", "3", "--json",
                   "--mode", "eager", "--fast", cwd=user_dir)
    assert proc.returncode == 1
    block = json.loads(proc.stdout)["results"][0]["first_order"]["blocks"][0]
    assert block["input"] == 0
    assert block["diagnosis"] == "the analytic gradient is off by a constant factor 2.0"
    worst = block["worst"][0]
    assert worst["analytic"] == pytest.approx(2 * worst["numeric"], rel=1e-6)


def test_user_function_in_eager_and_jit_modes(user_dir):
    proc = run_cli("check", "usermod:plain", "--shape", "2,3", "--shape", "3", "--json",
                   cwd=user_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert [r["mode"] for r in data["results"]] == ["eager", "jit"]
    jit = data["results"][1]["first_order"]
    if JIT_BUILT:
        assert jit["status"] == "pass", jit
    else:
        assert jit["status"] == "n/a" and jit["note"] == "nbgrad.jit not built"


@pytest.mark.parametrize(("args", "needle"), [
    (["check", "no_such_op"], "unknown op 'no_such_op'"),
    (["check", "usermod:wrong", "--shape", "3,x"], "bad --shape '3,x'"),
    (["check", "missing_module:f", "--shape", "3"], "cannot import module 'missing_module'"),
    (["check", "usermod:nope", "--shape", "3"], "module 'usermod' has no function 'nope'"),
    (["check", "usermod:NOT_A_FUNCTION", "--shape", "3"], "not a function"),
    (["check", "usermod:wrong"], "--shape"),
    (["check", "usermod:wrong", "--shape", "3", "--domain", "weird"], "unknown --domain"),
    (["check", "mul", "--bogus-flag"], "--bogus-flag"),
    (["check", "--dtype", "float16"], "float16"),
    (["check", "mul", "--shape", "3"], "MODULE:FUNCTION"),
])
def test_usage_errors_are_one_line_with_exit_2(user_dir, args, needle):
    line = one_line_error(run_cli(*args, cwd=user_dir, isolated_path=True))
    assert line.startswith("nbgrad check: error: ")
    assert needle in line


# ------------------------------------------------------------------ ops, bench
def test_ops_json_lists_the_table():
    proc = run_cli("ops", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["op"]: r for r in json.loads(proc.stdout)}
    from nbgrad.ops.registry import table
    assert set(rows) == set(table())
    mul = rows["mul"]
    assert mul["differentiable_inputs"] == ["self", "other"]
    assert mul["formulas"]["self"] == table()["mul"].formulas["self"].text
    assert mul["double_backward"] == "yes"
    assert rows["eq"]["differentiable"] is False and rows["eq"]["double_backward"] == "n/a"
    assert all(isinstance(r["cuda"], bool) for r in rows.values())
    # each op's declared kind (nbgrad.ops.traits)
    assert (mul["kind"], rows["mm"]["kind"], rows["reshape"]["kind"]) == \
        ("elementwise", "matmul", "view")
    assert rows["softmax"]["kind"] == "opaque (native)" and rows["dropout"]["kind"] == "opaque"


def test_ops_table_output():
    proc = run_cli("ops")
    assert proc.returncode == 0
    assert "double backward" in proc.stdout and "CUDA" in proc.stdout
    assert "grad * other" in proc.stdout


def test_bench_without_runner_says_what_is_missing(tmp_path):
    (tmp_path / "perf").mkdir()
    with pytest.raises(CliError, match="no __main__.py") as info:
        find_perf([tmp_path])
    assert info.value.code == 1
    with pytest.raises(CliError, match="no perf/ folder"):
        find_perf([tmp_path / "elsewhere"])


def test_bench_runs_the_perf_runner_with_the_selection(tmp_path):
    (tmp_path / "perf").mkdir()
    # a regular package: a namespace one would lose to a checkout's perf/ on PYTHONPATH
    # (the real runner would then run, for minutes, and write into perf/results/)
    (tmp_path / "perf" / "__init__.py").write_text("")
    (tmp_path / "perf" / "__main__.py").write_text(
        "import sys\nprint('runner got', ' '.join(sys.argv[1:]))\n")
    proc = run_cli("bench", "--workloads", "W1,W3", "--frameworks", "nbgrad,numba",
                   "--size", "tiny", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "runner got --workloads W1,W3 --frameworks nbgrad,numba --size tiny" in proc.stdout


# ------------------------------------------------------------------ in-process pieces
def test_parse_shape():
    assert parse_shape("3,4") == (3, 4)
    assert parse_shape("5") == (5,)
    assert parse_shape("(2, 3)") == (2, 3)
    assert parse_shape("()") == ()
    assert parse_shape("7,") == (7,)
    for bad in ("3,x", "-1", "3,,4", "a"):
        with pytest.raises(CliError, match="bad --shape"):
            parse_shape(bad)


def test_diagnosis_patterns():
    rng = np.random.default_rng(0)
    n = rng.standard_normal((4, 4))
    tol = {"atol": 1e-5, "rtol": 1e-3}
    assert constant_factor(0.5 * n, n, **tol) == pytest.approx(0.5)
    assert "constant factor 0.5" in diagnose(0.5 * n, n, (4,), **tol)
    assert "sign flipped" in diagnose(-n, n, (4,), **tol)
    assert "transpose" in diagnose(n.T, n, (4,), **tol)
    assert "not connected" in diagnose(np.zeros_like(n), n, (4,), connected=False, **tol)
    assert "zero although" in diagnose(np.zeros_like(n), n, (4,), **tol)
    kink = n.copy()
    kink[1, 2] += 1.0
    assert "only 1 of 16" in diagnose(kink, n, (4,), **tol)
    assert "no simple pattern" in diagnose(rng.standard_normal((4, 4)), n, (4,), **tol)
    assert "not finite" in diagnose(n, np.full_like(n, np.nan), (4,), **tol)
    # a transposed gradient of a square matrix input (one output row)
    g = rng.standard_normal((3, 3))
    assert "transposed positions" in diagnose(g.T.reshape(1, 9), g.reshape(1, 9), (3, 3),
                                              **tol)


def test_compare_jacobians_returns_what_gradcheck_raises():
    class Twice(nb.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            return g * 2.0

    x = nb.tensor(np.random.default_rng(1).standard_normal(3), requires_grad=True)
    cmp = compare_jacobians(Twice.apply, (x,))
    assert not cmp.ok and len(cmp.mismatches) == 3
    np.testing.assert_allclose(cmp.analytic[0][0], 2 * np.eye(3))
    np.testing.assert_allclose(cmp.numeric[0][0], np.eye(3), atol=1e-8)
    assert cmp.out_requires_grad == [True] and cmp.in_shapes == [(3,)]
    with pytest.raises(GradcheckError, match="Jacobian mismatch in 3 entries"):
        gradcheck(Twice.apply, (x,))
    assert compare_jacobians(nb.exp, (x,)).ok
    assert not compare_jacobians(Twice.apply, (x,), fast_mode=True).ok


def test_check_jit_rows_run_the_interpreter_not_its_eager_stand_in(monkeypatch):
    # While the interpreter builds in the background, tier 1 runs eager ops instead
    # (nbgrad.jit.tier1.interpreter.BACKGROUND); `nbgrad check` must check the interpreter.
    from nbgrad.cli.opcheck import CheckOptions, check_op
    from nbgrad.jit.tier1 import interpreter

    real_ready, seen = interpreter.ready, []

    def spy(args):
        seen.append(interpreter.BACKGROUND)
        return real_ready(args)

    monkeypatch.setattr(interpreter, "BACKGROUND", True)
    monkeypatch.setattr(interpreter, "ready", spy)
    (row,) = check_op("exp", CheckOptions(modes=("jit",)))
    assert row["first_order"]["status"] == "pass"
    assert seen and not any(seen)
