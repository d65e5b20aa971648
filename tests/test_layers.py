"""The four layers (sim -> envs -> agents -> lab): packaging and the import-linter contracts.

``tools/check_layers.py`` lints a copy of the package laid out as installed
(``agents/`` at ``flowgym/agents``); these tests run it on the tree as it is and on
copies with a deliberate upward import or circle, which the contracts must catch.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml on Python 3.10 needs tomli")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))
import check_layers  # noqa: E402

needs_linter = pytest.mark.skipif(importlib.util.find_spec("importlinter") is None,
                                  reason="import-linter is not installed (pip install -e '.[test]' in the flowgym checkout)")


def _packages() -> tuple[list[str], dict[str, str]]:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return cfg["packages"], cfg.get("package-dir", {})


def test_pyproject_lists_every_package_folder():
    """A new subpackage that is not listed would be missing from wheels: every folder with an
    ``__init__.py`` is listed, and every listed package exists where ``package-dir`` puts it."""
    packages, package_dir = _packages()
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "flowgym").rglob("__init__.py")}
    found |= {"flowgym.agents." + ".".join(p.parent.relative_to(REPO / "agents").parts)
              for p in (REPO / "agents").rglob("__init__.py")}
    found = {f.rstrip(".") for f in found if "__pycache__" not in f}
    assert found == set(packages)
    assert package_dir == {"flowgym.agents": "agents"}


def test_agents_are_flowgym_agents():
    import flowgym.agents as agents

    assert agents.__name__ == "flowgym.agents"
    assert Path(agents.__file__).resolve().parent == REPO / "agents"
    assert agents.FlowControl.__module__ == "flowgym.agents.flow_control"


def test_agents_refuse_a_top_level_import(tmp_path):
    """Imported as a top-level ``agents`` (another distribution's name), the folder refuses clearly."""
    spec = importlib.util.spec_from_file_location("agents", REPO / "agents" / "__init__.py",
                                                  submodule_search_locations=[str(REPO / "agents")])
    module = importlib.util.module_from_spec(spec)
    with pytest.raises(ImportError, match="flowgym.agents"):
        spec.loader.exec_module(module)


def _lint_with(tmp_path: Path, relpath: str, line: str):
    staged = check_layers.stage(tmp_path / "stage")
    target = staged / relpath
    target.write_text(target.read_text() + "\n" + line + "\n")
    return check_layers.lint(staged)


@needs_linter
def test_contracts_kept(tmp_path):
    result = check_layers.lint(check_layers.stage(tmp_path / "stage"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout


LAYERS, SIM, AGENTS, CIRCLES = "Four layers", "neither Gymnasium", "not the engine", "No import circles"


@needs_linter
@pytest.mark.parametrize("relpath, line, broken", [
    # the simulator importing the environment layer (an upward import; envs imports sim: a circle too)
    ("flowgym/sim/metrics.py", "import flowgym.envs.view", {LAYERS, CIRCLES}),
    # an agent importing the lab (the learned agent once imported training)
    ("flowgym/agents/base.py", "import flowgym.lab.scenarios", {LAYERS, CIRCLES}),
    # the simulator importing Gymnasium
    ("flowgym/sim/theory.py", "import gymnasium", {SIM}),
    # an agent reaching into the engine
    ("flowgym/agents/greedy.py", "from flowgym.sim.engine import Engine", {AGENTS}),
    # a circle inside one layer (rates is imported by workloads)
    ("flowgym/sim/rates.py", "import flowgym.sim.workloads", {CIRCLES}),
])
def test_contracts_catch_violations(tmp_path, relpath, line, broken):
    result = _lint_with(tmp_path, relpath, line)
    assert result.returncode != 0
    broken_lines = [ln for ln in result.stdout.splitlines() if ln.endswith(" BROKEN")]
    assert {b for b in broken if any(b in ln for ln in broken_lines)} == broken, result.stdout
    assert len(broken_lines) == len(broken), result.stdout
