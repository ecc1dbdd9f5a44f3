"""deploy/release.sh --out DIR adds this release to DIR: a directory that keeps earlier
releases (`--out /srv/releases`) keeps them, only the files of this build's names are
replaced, and SHA256SUMS covers this build's files."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_a_release_into_a_directory_of_releases_keeps_the_others(tmp_path: Path) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    out = tmp_path / "releases"
    kept = {
        out / "0.0.9" / "greenfed-0.0.9-py3-none-any.whl": "an earlier release\n",
        out / "greenfed-0.0.8.tar.gz": "an earlier sdist\n",
        out / "NOTES.txt": "the operator's own file\n",
    }
    for path, text in kept.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    wheel = out / f"greenfed-{version}-py3-none-any.whl"
    wheel.write_text("a stale build of this version\n")

    built = subprocess.run(
        ["bash", str(REPO / "deploy/release.sh"), "--out", str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert built.stdout.strip() == str(out)

    for path, text in kept.items():
        assert path.read_text() == text, f"{path} was not kept"
    assert zipfile.is_zipfile(wheel), "the stale wheel of the same name was not replaced"
    assert (out / f"greenfed-{version}.tar.gz").is_file()
    listed = sorted(
        line.split(maxsplit=1)[1] for line in (out / "SHA256SUMS").read_text().splitlines()
    )
    assert listed == [f"greenfed-{version}-py3-none-any.whl", f"greenfed-{version}.tar.gz"]
    checked = subprocess.run(
        ["sha256sum", "--check", "--strict", "SHA256SUMS"],
        cwd=out,
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert {path.name for path in out.iterdir()} == {
        "0.0.9",
        "greenfed-0.0.8.tar.gz",
        "NOTES.txt",
        wheel.name,
        f"greenfed-{version}.tar.gz",
        "SHA256SUMS",
    }, "the build left something else behind"
