"""The README's example runs, and CI runs the README's test command."""

import pathlib
import re

ROOT = pathlib.Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_usage_example_runs(tmp_path, monkeypatch):
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    assert (tmp_path / "mlp.so").stat().st_size > 0


def test_ci_runs_the_readme_test_command():
    blocks = re.findall(r"```sh\n(.*?)\n```", README, re.S)
    assert len(blocks) >= 2  # the first two: the main job, the tests
    assert blocks[1].strip() in (ROOT / ".ci" / "run").read_text()
