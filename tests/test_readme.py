"""The README's two set-up commands stay true: CI runs the test command verbatim."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands():
    text = (ROOT / "README.md").read_text()
    blocks = text.split("```bash\n")[1:]
    return [b.split("```")[0].strip() for b in blocks]


def test_ci_runs_the_readme_test_command():
    main_job, tests = _commands()[:2]
    assert main_job.startswith("pip install -e .") and "xconv" in main_job
    assert tests.startswith('pip install -e ".[test]"') and "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()
    for command in (main_job, tests):           # the outside-plugin torch backends are installed and tested too
        assert "-e backends/xconv_torch" in command
        assert "-e backends/xconv_jax" in command     # and the JAX ones
