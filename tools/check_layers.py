#!/usr/bin/env python
"""Check the four-layer architecture with import-linter (contracts in ``pyproject.toml``).

The repository keeps ``agents/`` at its top but installs it as ``flowgym.agents``
(``package-dir`` in ``pyproject.toml``). import-linter (grimp) reads a package from one
folder, so this script lints a copy laid out as a wheel installs it:
``<tmp>/flowgym/`` with ``agents/`` inside as ``flowgym/agents/``. Exit status: 0 when
every contract is kept, 1 otherwise (import-linter's report on stdout).

    python tools/check_layers.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def stage(dest: Path, repo: Path = REPO) -> Path:
    """Copy ``flowgym/`` and ``agents/`` into ``dest`` as installed (``dest/flowgym/agents``)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc")
    shutil.copytree(repo / "flowgym", dest / "flowgym", ignore=ignore)
    shutil.copytree(repo / "agents", dest / "flowgym" / "agents", ignore=ignore)
    return dest


def lint(staged: Path, config: Path = REPO / "pyproject.toml") -> subprocess.CompletedProcess:
    """Run ``lint-imports`` on a staged copy; its own folder comes first on the import path.

    ``config`` is copied into the staged folder as ``pyproject.toml``, where every import-linter
    version finds it without an option (``--config`` is deprecated since 2.x, the positional form
    missing before)."""
    shutil.copyfile(config, staged / "pyproject.toml")
    env = {**os.environ, "PYTHONPATH": str(staged)}
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
         "sys.exit(lint_imports_command())", "--no-cache"],
        cwd=staged, env=env, capture_output=True, text=True,
    )


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="flowgym-layers-") as tmp:
        result = lint(stage(Path(tmp)))
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return 0 if result.returncode == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
