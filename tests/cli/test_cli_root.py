import subprocess
import sys

from tuner import __version__


def test_version_command_prints_package_version():
    out = subprocess.run(
        [sys.executable, "-m", "tuner", "version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == __version__


def test_unknown_command_exits_with_usage_error():
    out = subprocess.run([sys.executable, "-m", "tuner", "no-such-command"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "No such command" in out.stderr
