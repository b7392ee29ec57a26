"""Write every kiln package's entry points (``kiln.backends``, ``kiln.codegens``) as
``*.dist-info`` folders, which is what ``pip install`` would have left: on the lent GPU machine
nothing is installed, the packages run from ``packages/*/src`` on PYTHONPATH, and backends and
codegens are found through entry points. Prints the folder to put on PYTHONPATH.

    python3 scripts/entry_points.py [DEST]
"""

from __future__ import annotations

import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_entry_points(dest: str | None = None) -> str:
    meta = Path(dest) if dest else Path(tempfile.mkdtemp(prefix="kiln-entry-points-"))
    meta.mkdir(parents=True, exist_ok=True)
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        eps = project.get("entry-points", {})
        if not eps:
            continue
        version = project.get("version", "0")
        info = meta / f"{project['name'].replace('-', '_')}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text("".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n"
            for group, items in eps.items()))
    return str(meta)


if __name__ == "__main__":
    print(write_entry_points(sys.argv[1] if len(sys.argv) > 1 else None))
