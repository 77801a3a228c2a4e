"""The command line as a user meets it: help for every subcommand, --version, exit codes, pipes, Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import xconv
from xconv import cli

def _sigint_default():
    """A child of a background job inherits SIGINT ignored (then Python installs no handler): restore it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)



def run(*args, **kw):
    return subprocess.run([sys.executable, "-m", "xconv", *args], capture_output=True, text=True, timeout=120, **kw)


HELPS = {
    (): "usage: xconv [-h] [--version] {backends,run,conformance} ...",
    ("backends",): "usage: xconv backends [-h]",
    ("run",): "usage: xconv run [-h]",
    ("conformance",): "usage: xconv conformance [-h] {check,run,compare,cases,list,fuzz} ...",
    ("conformance", "check"): "usage: xconv conformance check [-h] [--backend NAME]",
    ("conformance", "run"): "usage: xconv conformance run [-h] --backend NAME --out FILE.xcr",
    ("conformance", "compare"): "usage: xconv conformance compare [-h]",
    ("conformance", "cases"): "usage: xconv conformance cases [-h]",
    ("conformance", "list"): "usage: xconv conformance cases [-h]",
    ("conformance", "fuzz"): "usage: xconv conformance fuzz [-h] --backend NAME",
}


def test_every_subcommand_has_its_own_help(capsys):
    for words, usage in HELPS.items():  # in this process: the same parser, without an interpreter start each
        assert cli.main([*words, "--help"]) == 0
        out = capsys.readouterr()
        assert out.out.startswith(usage), out.out[:300]
        assert "``" not in out.out  # no raw reStructuredText markup
        assert out.err == ""
    # and as a command
    out = run("conformance", "list", "--help")
    assert out.returncode == 0 and out.stdout.startswith(HELPS[("conformance", "list")])


def test_the_direct_kit_entry_point_has_the_same_help():
    out = subprocess.run([sys.executable, "-m", "xconv_conformance.cli", "list", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("usage: xconv conformance cases [-h]")


def test_version_names_xconv_and_every_backend():
    out = run("--version")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"xconv {xconv.__version__} (Python ")
    for info in xconv.list_backends():
        row = next(line for line in lines if line.startswith(f"backend {info.name} "))
        assert ("(available)" in row) == info.available
        if info.version:
            assert info.version in row


@pytest.mark.parametrize("args, message", [
    (("bogus",), "invalid choice: 'bogus'"),
    (("run", "--input", "abc"), "argument --input: expected ints"),
    (("run", "--mask", "12"), "--mask takes three 0/1 digits"),
    (("run", "--padding", "x:y"), "argument --padding: expected an int"),
    (("run", "--groups", "3"), "ShapeError: groups"),
    (("run", "--backend", "nope"), "no backend named 'nope'"),
    (("conformance", "bogus"), "invalid choice: 'bogus'"),
    (("conformance", "--bogus"), "unrecognized arguments: --bogus"),
    (("conformance", "run", "--backend", "numpy"), "the following arguments are required: --out"),
    (("conformance", "--backend", "nope", "--no-progress"), "no backend named 'nope' is registered"),
    (("conformance", "compare", "/nonexistent.xcr"), "/nonexistent.xcr"),
])
def test_usage_errors_exit_2_with_one_message(args, message, capsys):
    assert cli.main(list(args)) == 2
    err = capsys.readouterr().err
    assert message in err


@pytest.mark.parametrize("args, usage", [
    (("run", "--bogus"), "usage: xconv run "),
    (("backends", "--bogus"), "usage: xconv backends "),
    (("conformance", "run", "--backend", "numpy", "--out", "x.xcr", "--bogus"), "usage: xconv conformance run "),
    (("conformance", "compare", "--bogus", "a.xcr"), "usage: xconv conformance compare "),
])
def test_an_unknown_option_shows_its_subcommands_usage(args, usage, capsys):
    assert cli.main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and "unrecognized arguments: --bogus" in err


def test_usage_errors_as_commands():
    for args in (("run", "--groups", "3"), ("conformance", "--bogus")):
        out = run(*args)
        assert out.returncode == 2 and "Traceback" not in out.stderr and "error" in out.stderr


def test_run_with_only_an_input_shape_derives_the_weight():
    out = run("run", "--input", "2x4x8x8", "--repeat", "0")
    assert out.returncode == 0, out.stderr
    assert "input=(2, 4, 8, 8) weight=(8, 4, 3, 3) output=(2, 8, 8, 8)" in out.stdout
    assert cli.default_weight([2, 6, 5], groups=3, transposed=True) == [6, 4, 3]
    out = run("run", "--input", "1x6x5", "--groups", "3", "--transposed", "--op", "fprop", "--repeat", "0")
    assert out.returncode == 0 and "weight=(6, 4, 3) output=(1, 12, 5)" in out.stdout
    # the printed checksum is of the real result on the derived weight
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((1, 6, 5)).astype(np.float32), rng.standard_normal((6, 4, 3)).astype(np.float32)
    y = xconv.conv_fprop(x, w, padding=1, groups=3, transposed=True)
    assert f"sum={y.astype(np.float64).sum():.6e}" in out.stdout


def test_a_closed_pipe_ends_quietly():
    for args in (["conformance", "cases", "--json"], ["--version"]):
        proc = subprocess.Popen([sys.executable, "-m", "xconv", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        proc.stdout.readline()
        proc.stdout.close()  # like `| head -1`
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
        assert "Traceback" not in err and "BrokenPipe" not in err, err
        assert code in (0, 141)


@pytest.mark.skipif(os.name != "posix", reason="sends SIGINT")
def test_ctrl_c_prints_one_line_and_exits_130():
    proc = subprocess.Popen([sys.executable, "-m", "xconv", "conformance", "--backend", "numpy-exact"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_default)
    lines = []
    while True:  # the phase lines come before the first case, even though stderr is a pipe
        line = proc.stderr.readline()
        lines.append(line)
        if "backend numpy-exact runs in worker processes" in line or not line:
            break
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "xconv: interrupted"
    assert "Traceback" not in err
    assert [re.sub(r"\(\d+\.\d s\)", "(t)", s.strip()) for s in lines] == [
        "xconv conformance: loading backend plugins ... done (t)",
        "xconv conformance: loading the case corpus ... done (t)",
        "xconv conformance: backend numpy-exact runs in worker processes (the first case starts one)"]
