"""The fenced blocks of README.md and docs/*.md: every Python block runs, every command parses.

- A ```python block runs as written, alone (its own imports; nothing carries over from the block
  before), in a fresh Python process whose working directory is an empty temporary folder: a block
  that needs data makes it (tiny synthetic videos, frames, tensors), as a reader trying it would.
- A ```bash block's commands (split at ``&&``, ``||``, ``;`` and ``|``; ``\\`` continuations and
  ``#`` comments as the shell reads them) are parsed, not run: ``lightning-multigrid SUBCOMMAND ...``
  by that subcommand's own argument parser (``fit``/``validate``/``test``: each ``--flag`` must be in
  the LightningCLI's ``--help``), ``python <script>.py ...`` of a script in this repository by its
  ``--help`` (each ``--flag`` must be listed). Other commands (pip, ruff, ...) are not checked.
- A block that cannot run on a CPU in seconds (it needs a GPU or a download, or it is a fragment of
  a full-scale run) says so on the line before its fence, with the reason, and is skipped by name:

      <!-- doc-test: skip (needs a download: the Kinetics-400 weights) -->
      ```python

  ``pytest -rs`` lists each skipped block (``file:line``) with its reason. A marker must be followed
  by a block, and a fenced block that holds commands must be tagged ``bash``.
- A quoted command output is checked: an untagged block marked ``<!-- doc-test: output -->`` is what
  the ``lightning-multigrid`` command of the ```bash block just before it prints (or, when the block
  starts with ``$ `` lines, what those lines' command prints). The command runs in a subprocess in an
  empty temporary folder and its stdout is compared line by line (trailing blanks ignored): a line
  ``...`` stands for any lines, a line ending in ``...`` for any line that starts with the text before
  it, every other line must be equal. No tolerance: every checked output is deterministic. An
  output that is a measurement (wall-clock of a minutes-long run) cannot be re-run here and is marked
  ``skip (reason)``; an untagged block right after a ```bash block must carry one of the two markers,
  so no quoted output goes unchecked without a word.

Failures name the file and the line of the block's opening fence.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import functools
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from lightning_multigrid.cli.commands import COMMANDS, LIGHTNING_COMMANDS, main

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^(`{3,})([\w+-]*)\s*$")
MARKER = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
SKIP = re.compile(r"^skip \((.+)\)$")
OUTPUT = "output"
OUTPUT_TIMEOUT_S = 300
BASH = {"bash", "sh", "shell"}
PYTHON_TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    marker: str | None  # the doc-test comment on the line before the fence, if any

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        match = SKIP.match(self.marker or "")
        return match.group(1) if match else None


def read_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, with the ``doc-test`` marker just before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == opening.group(1)), None)
        if end is None:
            raise ValueError(f"{path.relative_to(REPO)}:{i + 1}: the fenced block is never closed")
        marker = MARKER.match(lines[i - 1].strip()) if i > 0 else None
        code = "\n".join(lines[i + 1 : end]) + "\n"
        blocks.append(Block(path, i + 1, opening.group(2).lower(), code, marker.group(1) if marker else None))
        i = end + 1
    return blocks


BLOCKS = [block for path in DOCS for block in read_blocks(path)]
PYTHON = [block for block in BLOCKS if block.language == "python"]
COMMAND_BLOCKS = [block for block in BLOCKS if block.language in BASH]


def quoted_outputs() -> list[tuple[Block, Block | None]]:
    """Each untagged block right after a ```bash block, or marked as an output, with the block before it."""
    pairs = []
    for path in DOCS:
        blocks = read_blocks(path)
        for before, block in zip([None, *blocks], blocks):
            after_command = before is not None and before.language in BASH
            if block.language == "" and (after_command or block.marker == OUTPUT):
                pairs.append((block, before))
    return pairs


OUTPUTS = quoted_outputs()


def _param(block: Block) -> object:
    reason = block.skip_reason
    marks = [pytest.mark.skip(reason=f"{block.name}: {reason}")] if reason else []
    return pytest.param(block, id=block.name, marks=marks)


# ------------------------------------------------------------------ Python blocks


@pytest.mark.parametrize("block", [_param(block) for block in PYTHON])
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(block.code, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=PYTHON_TIMEOUT_S
    )
    assert result.returncode == 0, (
        f"{block.name}: the Python block failed (exit {result.returncode}); its line N is the file's line "
        f"{block.line} + N:\n{result.stderr[-4000:]}"
    )


# ------------------------------------------------------------------ commands


def shell_commands(code: str) -> list[list[str]]:
    """Each simple command of a shell block, as its words (redirections dropped)."""
    commands: list[list[str]] = []
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
        current: list[str] = []
        i = 0
        while i < len(tokens):
            if tokens[i] in {"&&", "||", ";", "|", "&"}:
                commands.append(current)
                current = []
            elif tokens[i] in {">", ">>", "<"}:
                i += 1  # and its target
            else:
                current.append(tokens[i])
            i += 1
        commands.append(current)
    return [command for command in commands if command]


def _without_prefixes(words: list[str]) -> list[str]:
    """The command itself, without ``VAR=value``, ``timeout N``, ``nice -n N`` or ``time`` before it."""
    while words:
        if re.match(r"^[A-Za-z_]\w*=", words[0]) or words[0] == "time":
            words = words[1:]
        elif words[0] == "timeout" and len(words) > 1:
            words = words[2:]
        elif words[0] == "nice" and len(words) > 2 and words[1] == "-n":
            words = words[3:]
        else:
            return words
    return words


def _help_text(run: Callable[..., object], *args: object) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
        run(*args)
    return out.getvalue()


@functools.cache
def lightning_cli_flags(subcommand: str) -> frozenset[str]:
    argv = sys.argv
    sys.argv = ["lightning-multigrid"]  # LightningCLI warns when it sees pytest's own arguments there
    try:
        return frozenset(re.findall(r"(?<![\w-])--[A-Za-z][\w.-]*", _help_text(main, [subcommand, "--help"])))
    finally:
        sys.argv = argv


@functools.cache
def script_flags(script: Path) -> frozenset[str]:
    def run_help() -> None:
        argv, path = sys.argv, list(sys.path)
        sys.argv = [str(script), "--help"]
        sys.path.insert(0, str(script.parent))  # as `python script.py` does: its sibling modules import
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            sys.argv, sys.path[:] = argv, path

    return frozenset(re.findall(r"(?<![\w-])--[A-Za-z][\w.-]*", _help_text(run_help)))


def _flags(words: list[str]) -> list[str]:
    return [word.split("=", 1)[0] for word in words if word.startswith("--") and len(word) > 2]


def command_problem(words: list[str]) -> str | None:
    """Why the command would not parse, or ``None`` (also for commands this test does not check)."""
    words = _without_prefixes(words)
    if words[:3] in (["python", "-m", "lightning_multigrid.cli"], ["python3", "-m", "lightning_multigrid.cli"]):
        words = ["lightning-multigrid", *words[3:]]
    if words and words[0] == "lightning-multigrid":
        if len(words) < 2:
            return "no subcommand"
        subcommand, args = words[1], words[2:]
        if subcommand in LIGHTNING_COMMANDS:
            unknown = [flag for flag in _flags(args) if flag not in lightning_cli_flags(subcommand)]
            return f"`{subcommand} --help` does not list {unknown}" if unknown else None
        if subcommand not in COMMANDS:
            return f"no subcommand {subcommand!r} (there are {sorted([*COMMANDS, *LIGHTNING_COMMANDS])})"
        parser = argparse.ArgumentParser(prog=f"lightning-multigrid {subcommand}")
        COMMANDS[subcommand][1](parser)  # the subcommand's own arguments, as `main` registers them
        errors = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
            try:
                parser.parse_args(args)
            except SystemExit as exit:
                if exit.code:
                    return errors.getvalue().strip()
        return None
    if len(words) > 1 and words[0] in ("python", "python3") and words[1].endswith(".py"):
        script = REPO / words[1]
        if not script.is_file():
            return f"no script {words[1]} in the repository"
        unknown = [flag for flag in _flags(words[2:]) if flag not in script_flags(script)]
        return f"`{words[1]} --help` does not list {unknown}" if unknown else None
    return None


@pytest.mark.parametrize("block", [_param(block) for block in COMMAND_BLOCKS])
def test_bash_block_commands_parse(block: Block) -> None:
    problems = [
        f"  {shlex.join(words)}\n    {problem}"
        for words in shell_commands(block.code)
        if (problem := command_problem(words)) is not None
    ]
    assert not problems, f"{block.name}: commands that do not parse:\n" + "\n".join(problems)


# ------------------------------------------------------------------ quoted outputs


def output_command(block: Block, before: Block | None) -> tuple[list[str], str]:
    """The command (its words after ``lightning-multigrid``) whose output ``block`` quotes, and the quoted output.

    Raises:
        ValueError: naming the block, when no single ``lightning-multigrid`` command can be found.
    """
    lines = block.code.splitlines()
    if lines and lines[0].startswith("$ "):
        count = 1
        while lines[count - 1].endswith("\\"):
            count += 1
        source, expected = "\n".join(lines[:count])[2:], "\n".join(lines[count:]) + "\n"
    elif before is not None and before.language in BASH:
        source, expected = before.code, block.code
    else:
        raise ValueError(f"{block.name}: an output block must follow a ```bash block or start with `$ ` lines")
    commands = [_without_prefixes(words) for words in shell_commands(source)]
    if len(commands) != 1 or commands[0][:1] != ["lightning-multigrid"]:
        raise ValueError(f"{block.name}: the output of {commands} cannot be checked: quote one `lightning-multigrid` command")
    return commands[0][1:], expected


def output_pattern(expected: str) -> re.Pattern[str]:
    """The quoted output as a pattern over whole lines: ``...`` any lines, ``text...`` a line starting with text."""
    parts = []
    for line in expected.splitlines():
        line = line.rstrip()
        if line == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        elif line.endswith("..."):
            parts.append(re.escape(line[:-3]) + r"[^\n]*\n")
        else:
            parts.append(re.escape(line) + r"\n")
    return re.compile("".join(parts))


def output_matches(expected: str, printed: str) -> bool:
    text = "".join(line.rstrip() + "\n" for line in printed.splitlines())
    return output_pattern(expected).fullmatch(text) is not None


def _output_param(block: Block, before: Block | None) -> object:
    reason = block.skip_reason
    marks = [pytest.mark.skip(reason=f"{block.name}: {reason}")] if reason else []
    return pytest.param(block, before, id=block.name, marks=marks)


@pytest.mark.parametrize(("block", "before"), [_output_param(block, before) for block, before in OUTPUTS])
def test_quoted_output_is_what_the_command_prints(block: Block, before: Block | None, tmp_path: Path) -> None:
    assert block.marker == OUTPUT, (
        f"{block.name}: a block right after a ```bash block is a quoted output: mark it `<!-- doc-test: output -->` "
        "(checked) or `<!-- doc-test: skip (reason) -->`"
    )
    args, expected = output_command(block, before)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "lightning_multigrid.cli", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=OUTPUT_TIMEOUT_S,
    )
    assert result.returncode == 0, f"{block.name}: the command failed (exit {result.returncode}):\n{result.stderr[-3000:]}"
    if not output_matches(expected, result.stdout):
        diff = difflib.unified_diff(expected.splitlines(), result.stdout.splitlines(), "quoted", "printed", lineterm="")
        pytest.fail(f"{block.name}: the quoted output is not what `lightning-multigrid {shlex.join(args)}` prints now "
                    "(`...` lines stand for any lines):\n" + "\n".join(diff))


# ------------------------------------------------------------------ the mechanism itself


def test_every_marker_is_a_known_one_before_a_block() -> None:
    problems = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        fences = {block.line for block in read_blocks(path)}
        for number, line in enumerate(lines, start=1):
            marker = MARKER.match(line.strip())
            if marker and not SKIP.match(marker.group(1)) and marker.group(1) != OUTPUT:
                problems.append(f"{path.relative_to(REPO)}:{number}: unknown doc-test marker {marker.group(1)!r}")
            elif marker and number + 1 not in fences:
                problems.append(f"{path.relative_to(REPO)}:{number}: a doc-test marker must be the line before a fence")
    assert not problems, "\n".join(problems)


def test_command_blocks_are_tagged_bash() -> None:
    untagged = [
        block.name
        for block in BLOCKS
        if block.language not in BASH
        and any(_without_prefixes(words)[:1] == ["lightning-multigrid"] for words in _safe_commands(block.code))
    ]
    assert not untagged, f"blocks with commands must be tagged ```bash (so this test parses them): {untagged}"


def _safe_commands(code: str) -> list[list[str]]:
    try:
        return shell_commands(code)
    except ValueError:  # not shell at all (an unbalanced quote in a table or a message)
        return []


def test_the_command_checks_catch_a_wrong_flag_and_a_wrong_subcommand() -> None:
    assert command_problem(["lightning-multigrid", "schedule", "--batch-size", "8", "--num-frames", "8",
                            "--crop-size", "32", "--max-epochs", "10"]) is None
    assert "unrecognized arguments: --batch-sise" in (
        command_problem(["lightning-multigrid", "schedule", "--batch-size", "8", "--batch-sise", "8", "--num-frames", "8",
                         "--crop-size", "32", "--max-epochs", "10"]) or ""
    )
    assert "--no-such-flag" in (command_problem(["python", "benchmarks/step.py", "--smoke", "--no-such-flag"]) or "")
    assert "no subcommand 'shedule'" in (command_problem(["lightning-multigrid", "shedule"]) or "")
    assert "--multigrid.enabeld" in (command_problem(["lightning-multigrid", "fit", "--multigrid.enabeld", "false"]) or "")
    assert command_problem(["lightning-multigrid", "fit", "--multigrid.enabled", "false"]) is None
    block = "a x && nice -n 19 b --y \\\n  --z 1 > out.txt  # c --w\n"
    assert shell_commands(block) == [["a", "x"], ["nice", "-n", "19", "b", "--y", "--z", "1"]]


def test_the_output_check_elides_and_catches_a_changed_number() -> None:
    printed = "a  1\nb  2\nc  3\nd long line\n"
    assert output_matches("a  1\n...\nd long...\n", printed)
    assert output_matches("a  1\nb  2\nc  3\nd long line\n", printed.replace("\n", "  \n"))
    assert not output_matches("a  1\n...\nc  4\n...\n", printed)  # a stale number
    assert not output_matches("a  1\nb  2\n", printed)  # the rest of the output needs a `...`
    block = Block(REPO / "README.md", 1, "", "$ lightning-multigrid schedule --batch-size 8 \\\n    --num-frames 4\nout\n", OUTPUT)
    assert output_command(block, None) == (["schedule", "--batch-size", "8", "--num-frames", "4"], "out\n")


# ------------------------------------------------------------------ lists the docs keep of the code


def _section(path: Path, heading: str) -> str:
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_backbones_table_lists_every_backbone() -> None:
    """The table lacked the four transformers (issue 41)."""
    from lightning_multigrid.models.backbones import BACKBONES

    table = _section(REPO / "docs" / "trainer.md", "## Backbones")
    missing = [name for name in BACKBONES if f"`{name}`" not in table]
    assert not missing, f"docs/trainer.md's backbones table lacks {missing}"


def test_the_public_api_section_names_every_public_name() -> None:
    """docs/architecture.md's public names lacked `ClipCost` and `measure_clip_costs` (issue 41)."""
    import lightning_multigrid
    import lightning_multigrid.data

    section = _section(REPO / "docs" / "architecture.md", "## Public API")
    missing = [name for name in [*lightning_multigrid.__all__, *lightning_multigrid.data.__all__] if f"`{name}`" not in section]
    assert not missing, f"docs/architecture.md's Public API section lacks {missing}"
