"""`./dev setup` recovers from an interrupted first set-up: a .venv left without pip is
rebuilt (one line says so), where it used to fail every later run until removed by hand.

The repository's ./dev runs on a copy of the project whose two packages build with an
in-tree backend that needs nothing from a package index, so the test runs offline
(PIP_NO_INDEX) and in seconds, through the script's real venv and pip steps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A PEP 517/660 build backend in a few lines: the wheel holds the metadata only.
BACKEND = '''
import base64, hashlib, zipfile

NAME = {name!r}


def _wheel(directory):
    dist = NAME.replace("-", "_") + "-0"
    files = {{
        dist + ".dist-info/METADATA": "Metadata-Version: 2.1\\nName: " + NAME + "\\nVersion: 0\\nProvides-Extra: test\\n",
        dist + ".dist-info/WHEEL": "Wheel-Version: 1.0\\nGenerator: in-tree\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(path + ",sha256=" + digest + "," + str(len(text.encode())))
    files[dist + ".dist-info/RECORD"] = "\\n".join(record + [dist + ".dist-info/RECORD,,"]) + "\\n"
    name = dist + "-py3-none-any.whl"
    with zipfile.ZipFile(directory + "/" + name, "w") as whl:
        for path, text in files.items():
            whl.writestr(path, text)
    return name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory)
'''

PYPROJECT = """[build-system]
requires = []
build-backend = "in_tree"
backend-path = ["."]

[project]
name = "{name}"
version = "0"
"""

REBUILT = ".venv has no working python or pip (an interrupted set-up?): rebuilding it"


def project(root: Path) -> Path:
    shutil.copy2(REPO / "dev", root / "dev")
    for folder, name in ((root, "probe-tuner"), (root / "backend", "probe-backend")):
        folder.mkdir(exist_ok=True)
        (folder / "pyproject.toml").write_text(PYPROJECT.format(name=name))
        (folder / "in_tree.py").write_text(BACKEND.format(name=name))
    return root


def dev_setup(root: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV", "TUNER_VENV"))}
    env.update(PYTHON=sys.executable, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return subprocess.run(["bash", str(root / "dev"), "setup"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_venv_left_without_pip_is_rebuilt_and_the_set_up_completes(tmp_path: Path) -> None:
    root = project(tmp_path)
    # What an interrupted first set-up leaves: the venv's python, no pip.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True, timeout=300)

    first = dev_setup(root)

    assert first.returncode == 0, first.stderr
    assert REBUILT in first.stderr.splitlines()
    venv_python = root / ".venv" / "bin" / "python"
    assert subprocess.run([str(venv_python), "-m", "pip", "--version"], capture_output=True).returncode == 0
    assert (root / ".venv" / ".installed").is_file()
    installed = subprocess.run([str(venv_python), "-m", "pip", "list"], capture_output=True, text=True).stdout
    assert "probe-tuner" in installed and "probe-backend" in installed

    again = dev_setup(root)  # set up: nothing to do, nothing said
    assert again.returncode == 0 and again.stderr == ""


def test_a_folder_that_is_not_a_venv_is_never_emptied(tmp_path: Path) -> None:
    root = project(tmp_path)
    (root / ".venv").mkdir()
    (root / ".venv" / "notes.txt").write_text("mine")

    done = dev_setup(root)

    assert done.returncode == 2
    assert "is not a Python venv; move it away or set TUNER_VENV to another path" in done.stderr
    assert (root / ".venv" / "notes.txt").read_text() == "mine"
