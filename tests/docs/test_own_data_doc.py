"""docs/own-data.md, run end to end: every command of its ```bash blocks, in order.

The convention the doc follows (also stated at its top):

- Only fenced blocks opened with ```bash are run; ```text, ```yaml and the rest are
  output or file excerpts. Every non-blank line of a bash block is a command, except
  lines starting with ``#`` (comments). A line ending in ``\\`` continues on the next
  line; a here-document (``<<'EOF'``) runs up to its terminator line as one command.
- Each command runs in a fresh ``bash -o pipefail -c`` in one scratch directory (so no
  ``cd`` or variable carries over), with the venv's bin directory first on PATH.
  ``../shared/datasets`` stands for the shared data sets and is replaced by their path.
- A command must exit 0 unless its line ends with ``# exits N``. Such a command must
  also print one ``error:`` line on stderr, and the next fenced block of the doc (the
  output shown for it) must hold that exact line (request ids aside).
- A ```yaml block whose first line is ``# excerpt of PATH`` must appear verbatim in
  the file PATH the commands wrote. One whose first line is ``# in experiment.yaml``
  shows experiment sections for *your* service: it replaces those top-level sections
  of the generated experiment and must load with tuner.config.experiment.load_experiment.

Then the outcomes: the study holds the trials `tuner run --n-trials N` asked for, the
applied config differs from the imported one and its backup holds the original, and
no `fusion_backend serve` process started by these commands is still running.

Needs ../shared/datasets (skips without it; fails under TUNER_REQUIRE_INTEGRATION=1).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "own-data.md"
README = REPO / "README.md"
VENV_BIN = Path(sys.executable).parent
DATASETS_PLACEHOLDER = "../shared/datasets"
COMMAND_TIMEOUT_S = 300

_FENCE = re.compile(r"^```(\S*)\s*$")
_EXITS = re.compile(r"#\s*exits\s+(\d+)\s*$")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # 1-based line of the opening fence in the doc


@dataclass(frozen=True)
class Command:
    text: str
    expect: int
    block: int  # index into the doc's blocks
    line: int  # 1-based doc line where the command starts


def fenced_blocks(markdown: str) -> list[Block]:
    blocks: list[Block] = []
    lang, start, body = None, 0, []
    for n, line in enumerate(markdown.splitlines(), 1):
        m = _FENCE.match(line)
        if lang is None and m:
            lang, start, body = m.group(1), n, []
        elif lang is not None and line.strip() == "```":
            blocks.append(Block(lang, "\n".join(body), start))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"{DOC}:{start}: fence never closed"
    return blocks


def bash_commands(blocks: list[Block]) -> list[Command]:
    commands: list[Command] = []
    for index, block in enumerate(blocks):
        if block.lang != "bash":
            continue
        lines = block.text.split("\n")
        i = 0
        while i < len(lines):
            line = lines[i]
            start = block.line + 1 + i
            if not line.strip() or line.lstrip().startswith("#"):
                i += 1
                continue
            parts, expect_on = [line], line
            heredoc = _HEREDOC.search(line)
            if heredoc:
                terminator = heredoc.group(2)
                while len(parts) == 1 or parts[-1].strip() != terminator:
                    i += 1
                    assert i < len(lines), f"{DOC}:{start}: here-document never reaches {terminator}"
                    parts.append(lines[i])
            else:
                while parts[-1].rstrip().endswith("\\"):
                    i += 1
                    assert i < len(lines), f"{DOC}:{start}: continuation line missing"
                    parts.append(lines[i])
                expect_on = parts[-1]
            m = _EXITS.search(expect_on)
            commands.append(Command("\n".join(parts), int(m.group(1)) if m else 0, index, start))
            i += 1
    return commands


def error_line(stderr: str) -> str | None:
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    return errors[-1] if errors else None


def normalised(text: str) -> str:
    return " ".join(_UUID.sub("<uuid>", text).split())


def serve_processes(*markers: str) -> dict[int, str]:
    """pid -> command line of every `fusion_backend serve` whose command line names one of ``markers``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        cmdline = " ".join(a.decode(errors="replace") for a in argv if a)
        if "fusion_backend" in cmdline and "serve" in cmdline and any(m in cmdline for m in markers):
            found[int(entry.name)] = cmdline
    return found


def stop(pids: list[int]) -> None:
    """SIGTERM, then SIGKILL, the processes this test started (by pid)."""
    if not pids:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(2)


# -- the doc's shape: no data needed ------------------------------------------------


def test_doc_commands_parse_and_mark_expected_failures():
    blocks = fenced_blocks(DOC.read_text())
    commands = bash_commands(blocks)
    texts = [c.text for c in commands]
    assert any(t.startswith("python -m fusion_backend.importers cranfield ") for t in texts)
    assert any(t.startswith("python -m fusion_backend.importers files ") for t in texts)
    for verb in ("check", "run", "best", "report", "apply", "score"):
        assert any(t.startswith(f"tuner {verb} ") for t in texts), verb
    assert any("--dry-run" in t for t in texts)
    assert any(re.search(r"\s-l 2\b", t) for t in texts)
    failing = [c for c in commands if c.expect != 0]
    assert failing, "the doc shows at least one broken set-up (# exits 2)"
    for c in failing:
        following = blocks[c.block + 1] if c.block + 1 < len(blocks) else None
        assert following is not None and following.lang != "bash", (
            f"{DOC}:{c.line}: a command marked '# exits {c.expect}' is followed by the block showing its error")
        assert "error: " in following.text, f"{DOC}:{following.line}: shows no 'error:' line"
    for c in commands:
        syntax = subprocess.run(["bash", "-n", "-c", c.text], capture_output=True, text=True)
        assert syntax.returncode == 0, f"{DOC}:{c.line}: not valid bash: {syntax.stderr}"


def test_readme_links_the_doc_from_tuning_your_own_backend():
    readme = README.read_text()
    section = readme.split("## Tuning your own backend", 1)[1].split("\n## ", 1)[0]
    head = section.strip().split("\n\n", 1)[0]
    assert "docs/own-data.md" in head, "the link belongs at the top of the section"


# -- the doc, run -------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_command_of_the_doc_runs(datasets_dir: Path, tmp_path: Path):
    from tuner.config.experiment import load_experiment

    assert (VENV_BIN / "tuner").exists(), f"run the tests with the venv's python: no tuner next to {sys.executable}"
    blocks = fenced_blocks(DOC.read_text())
    commands = bash_commands(blocks)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("PYTHONPATH", None)  # the commands see what a user's shell sees
    run_cmd = next(c for c in commands if re.match(r"tuner run \S+ --n-trials \d+", c.text))
    experiment_rel, n_trials = re.match(r"tuner run (\S+) --n-trials (\d+)", run_cmd.text).groups()
    original_config: str | None = None
    timings: list[tuple[float, str]] = []
    try:
        for c in commands:
            script = c.text.replace(DATASETS_PLACEHOLDER, str(datasets_dir))
            began = time.monotonic()
            proc = subprocess.run(["bash", "-o", "pipefail", "-c", script], cwd=work, env=env,
                                  capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
            timings.append((time.monotonic() - began, c.text.split("\n")[0]))
            where = f"{DOC}:{c.line}: `{c.text.splitlines()[0]}`"
            assert proc.returncode == c.expect, (
                f"{where} exited {proc.returncode}, the doc says {c.expect}\n"
                f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")
            if c.expect != 0:
                actual = error_line(proc.stderr)
                assert actual, f"{where}: no 'error:' line on stderr:\n{proc.stderr[-2000:]}"
                shown = [normalised(ln) for ln in blocks[c.block + 1].text.splitlines()]
                assert normalised(actual) in shown, (
                    f"{where}: the doc's block at line {blocks[c.block + 1].line} does not show the error "
                    f"it prints now:\n{actual}")
            experiment_path = work / experiment_rel
            if original_config is None and experiment_path.exists():
                config = load_experiment(experiment_path).target.config_files[0]
                original_config = config.read_text()
        exp = load_experiment(work / experiment_rel)
        check_study(exp, int(n_trials))
        check_applied(exp, original_config)
        check_excerpts(blocks, work)
        check_fragments(blocks, work / experiment_rel, tmp_path)
    finally:
        time.sleep(0.5)
        left = serve_processes(str(work), str(work.resolve()))
        stop(list(left))
        print("\n".join(f"{s:6.1f}s  {cmd}" for s, cmd in timings))
    assert not left, f"backend processes still running after the doc's commands: {left}"


def check_study(exp, n_trials: int) -> None:
    import optuna

    study = optuna.load_study(study_name=exp.study, storage=exp.storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(study.trials) == n_trials and len(complete) == n_trials, (
        [(t.number, t.state.name, t.user_attrs.get("fail_reason")) for t in study.trials])
    assert any(t.user_attrs.get("variant") == "baseline" for t in complete), "trial 0 is the baseline"
    assert any(_feasible(t) for t in complete), "a feasible trial to apply"


def _feasible(trial) -> bool:
    values = trial.constraints
    values = list(values.values()) if isinstance(values, dict) else list(values or [])
    return bool(values) and all(v <= 0 for v in values)


def check_applied(exp, original: str | None) -> None:
    assert original is not None, "the import wrote the config the experiment patches"
    config = exp.target.config_files[0]
    assert config.read_text() != original, "`tuner apply` changed the config"
    backups = sorted((exp.state_dir / "backups").glob("*/*"))
    assert backups, f"no backup under {exp.state_dir / 'backups'}"
    assert any(b.read_text() == original for b in backups), "the backup holds the config as imported"


def check_excerpts(blocks: list[Block], work: Path) -> None:
    """Each `# excerpt of PATH` block is a verbatim slice of what the commands wrote."""
    excerpts = [b for b in blocks if b.lang == "yaml" and b.text.startswith("# excerpt of ")]
    assert excerpts, "the doc shows the generated experiment"
    for block in excerpts:
        header, body = block.text.split("\n", 1)
        written = (work / header.removeprefix("# excerpt of ").strip()).read_text()
        assert body in written, f"{DOC}:{block.line}: the excerpt no longer matches {header[2:]}"


def check_fragments(blocks: list[Block], generated: Path, tmp_path: Path) -> None:
    """Each `# in experiment.yaml` block, put into the generated experiment, loads."""
    from ruamel.yaml import YAML

    from tuner.config.experiment import load_experiment

    yaml = YAML()
    fragments = [b for b in blocks if b.lang == "yaml" and b.text.startswith("# in experiment.yaml")]
    assert fragments, "the doc shows how to point the experiment at your own service"
    for n, block in enumerate(fragments):
        doc = yaml.load(generated.read_text())
        for key, value in yaml.load(block.text).items():
            doc[key] = value
        path = tmp_path / f"fragment-{n}.yaml"
        with path.open("w") as fh:
            yaml.dump(doc, fh)
        try:
            load_experiment(path, check_paths=False)
        except Exception as exc:  # noqa: BLE001 - the message is the point
            pytest.fail(f"{DOC}:{block.line}: the experiment sections shown do not load: {exc}")
