"""Fill mypy's cache with the installed packages the shipped code imports (Airflow, torch, MLflow, pydantic
...), so that the first `make lint` checks only trainyard's own files: about 45 s of a cold lint's 50 s is
spent reading those packages, once per environment. Run by `make setup`; the imports are found in the code,
never listed by hand.

    .venv/bin/python scripts/warm_mypy_cache.py
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def third_party_imports() -> list[str]:
    """Every module the shipped code imports that is neither its own nor the standard library's."""
    mypy = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    # each folder of mypy_path is on sys.path: its files and packages are top-level modules
    ours = {p.stem for folder in mypy["mypy_path"] for p in (REPO / folder).iterdir()}
    modules: set[str] = set()
    for folder in mypy["files"]:  # the code `make lint` runs mypy on
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    modules.update(alias.name for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules.add(node.module)
    return sorted(m for m in modules if m.split(".")[0] not in ours | set(sys.stdlib_module_names))


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="trainyard-mypy-") as tmp:
        probe = Path(tmp) / "installed_packages.py"
        probe.write_text("".join(f"import {m}\n" for m in third_party_imports()))
        # the project's config (plugins, overrides) and cache folder, as `make lint` uses them
        code = subprocess.run([sys.executable, "-m", "mypy", str(probe)], cwd=REPO, check=False).returncode
    # 1: mypy has findings in the packages themselves, and cached them all the same; 2: it could not run
    return 0 if code in (0, 1) else code


if __name__ == "__main__":
    sys.exit(main())
