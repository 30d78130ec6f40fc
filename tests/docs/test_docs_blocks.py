"""The docs are tests: every fenced block of README.md and docs/*.md runs here, in document order.

One pytest item per block (``README.md:142-bash``), so a block that fails is named by its file
and line, with its output, and a block that is not run is a visible skip with its reason. The
blocks of one document share one fresh temporary directory (their working directory) and one
fresh ``HOME``, so a block that leans on a step the document does not state fails:

- ``bash``/``sh``/``shell`` blocks run with ``bash`` under ``set -euo pipefail``; ``console``
  blocks the same, with only their ``$ `` lines (the rest is output).
- ``python`` blocks run each as its own script with this venv's python: blocks of a document
  share files, not variables, so each block imports and defines what it uses.
- ``toml`` blocks are agent configuration (the only TOML edgesdk reads): parsed and validated
  against ``edgesdk.schemas.agent_config.AgentConfig`` (a block holding only some sections is
  validated as part of a config with a placeholder ``device_id`` and ``profile``).
- ``json``, ``yaml`` and ``xml`` blocks are parsed; other languages (``conf``, ``ini``,
  ``promql``, ...) are not run. An untagged block is a diagram, a tree, output or a synopsis
  with ``[options]``/``...``: not code, and ``test_untagged_blocks_hold_no_commands`` checks
  that it holds no plain commands.

A block that cannot run here says so on its first line, in the document, with the reason::

    # not run by the docs tests: needs a Raspberry Pi reachable over ssh

and becomes a skip with that reason. Only hardware, real remote hosts, root-only system
installs and the like qualify: a missing file or a server the reader must start is a step
the document states.

What the runner adapts, as a reader would: the venv's ``bin`` is first on ``PATH`` (and
``/usr/sbin``, where Debian puts mosquitto, is on it) and no ``EDGESDK_*`` variable leaks in;
the documented ports (the agent's 8470 and 8471, MQTT's 1883, the fleet service's 8080) are
replaced by free ones, the same in every block of a document, so nothing collides with another
test or a real service. A shell block that calls mosquitto or curl where it is not installed,
or a python block importing a package that is not, is skipped with that reason, and so are the
document's later blocks. Every block starts in a process group of
its own; what a block leaves running in the background (``edge-agent run ... &``) is stopped
after the document's last block (SIGTERM, then SIGKILL). A document that trains the digits
CNN into ``digits/`` (``prepare_digits(Path("digits"))``, which reuses what is there) finds the
test session's trained copy there first, so the model is trained once per session.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10, as agent/config.py
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

#: The first line of a block that is not run, followed by the reason (documented in README.md).
SKIP_PREFIX = "# not run by the docs tests:"

SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
PYTHON_LANGUAGES = {"python", "py"}
PARSED_LANGUAGES = {"toml", "json", "yaml", "yml", "xml"}

#: Documented ports, replaced per document by free ones.
DOCUMENTED_PORTS = (8470, 8471, 1883, 8080)

BLOCK_TIMEOUT_S = 240
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
TRAINS_DIGITS = re.compile(r"""prepare_digits\(Path\(["']digits["']\)\)""")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language (lower case, "" when untagged) and text."""

    document: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str

    @property
    def where(self) -> str:
        name = self.document.relative_to(ROOT) if self.document.is_relative_to(ROOT) else self.document.name
        return f"{name}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        first = self.text.lstrip("\n").split("\n", 1)[0].strip()
        if first.startswith(SKIP_PREFIX):
            return first[len(SKIP_PREFIX) :].strip() or "(no reason given)"
        return None

    @property
    def runs(self) -> bool:
        return self.language in SHELL_LANGUAGES | PYTHON_LANGUAGES | PARSED_LANGUAGES


def parse_blocks(document: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, in order (indented fences, e.g. in lists, too)."""
    blocks: list[Block] = []
    lines = document.read_text(encoding="utf-8").split("\n")
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        language = opening["info"].strip().split(" ")[0].lower() if opening["info"].strip() else ""
        body: list[str] = []
        opened_at = index + 1
        index += 1
        while index < len(lines):
            closing = FENCE.match(lines[index])
            if closing and closing["fence"].startswith(fence) and not closing["info"].strip():
                break
            line = lines[index]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            index += 1
        else:
            raise ValueError(f"{document}:{opened_at}: a fence that never closes")
        blocks.append(Block(document, opened_at, language, "\n".join(body) + "\n"))
        index += 1
    return blocks


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def console_commands(text: str) -> str:
    """The commands of a console block: its ``$ `` lines and their ``\\`` continuations."""
    commands: list[str] = []
    continued = False
    for line in text.split("\n"):
        if line.startswith("$ ") or continued:
            commands.append(line[2:] if line.startswith("$ ") and not continued else line)
            continued = line.rstrip().endswith("\\")
    return "\n".join(commands) + "\n"


@dataclass
class DocumentRun:
    """The shared state of one document's blocks: directory, HOME, ports, background processes."""

    document: Path
    root: Path
    ports: dict[int, int]
    env: dict[str, str]
    process_groups: list[int] = field(default_factory=list)
    done: dict[int, str | None] = field(default_factory=dict)  # block index -> failure text or None
    closed: bool = False

    @property
    def work(self) -> Path:
        return self.root / "work"

    def adapt(self, text: str) -> str:
        for documented, free in self.ports.items():
            text = re.sub(rf"(?<![\d.]){documented}(?!\d)", str(free), text)
        return text

    def run(self, index: int, block: Block) -> str | None:
        """Run one block; None when it passed, else what to report."""
        script_dir = self.root / "blocks"
        script_dir.mkdir(exist_ok=True)
        log = script_dir / f"{index:03d}-{block.language}.log"
        if block.language in SHELL_LANGUAGES:
            text = console_commands(block.text) if block.language == "console" else block.text
            script = script_dir / f"{index:03d}.sh"
            script.write_text("set -euo pipefail\n" + self.adapt(text))
            command = ["bash", "--noprofile", "--norc", str(script)]
        elif block.language in PYTHON_LANGUAGES:
            script = script_dir / f"{index:03d}.py"
            script.write_text(self.adapt(block.text))
            command = [sys.executable, str(script)]
        else:
            return parse_failure(block)
        with log.open("wb") as output:
            # A log file, not a pipe: a server the block leaves in the background keeps a pipe
            # open, and reading one to its end would wait for that server to exit.
            process = subprocess.Popen(
                command,
                cwd=self.work,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.process_groups.append(process.pid)
            try:
                status = process.wait(timeout=BLOCK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                status = None
        if status == 0:
            return None
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
        what = f"timed out after {BLOCK_TIMEOUT_S} s" if status is None else f"exit status {status}"
        return f"{block.where} ({block.language}) failed: {what}; its output (last 60 lines):\n{tail}"

    def close(self) -> None:
        """Stop what the blocks left running: SIGTERM to each group, SIGKILL after 10 s."""
        if self.closed:
            return
        self.closed = True
        alive = [group for group in self.process_groups if _signal_group(group, signal.SIGTERM)]
        deadline = time.monotonic() + 10
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = [group for group in alive if _signal_group(group, 0)]
        for group in alive:
            _signal_group(group, signal.SIGKILL)


def _signal_group(group: int, signum: int) -> bool:
    try:
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def parse_failure(block: Block) -> str | None:
    """Parse a data block (and validate an agent config); None when it is fine."""
    try:
        if block.language == "toml":
            from edgesdk.schemas.agent_config import AgentConfig

            data = tomllib.loads(block.text)
            if "device_id" not in data:  # some sections of a config, e.g. [mqtt]
                data = {"device_id": "docs-test", "profile": "rpi5-8gb", **data}
            AgentConfig.model_validate(data)
        elif block.language == "json":
            json.loads(block.text)
        elif block.language in ("yaml", "yml"):
            import yaml

            yaml.safe_load(block.text)
        elif block.language == "xml":
            ElementTree.fromstring(block.text)
    except Exception as exc:  # noqa: BLE001 - any parse or validation error is the block's failure
        return f"{block.where} ({block.language}) does not parse: {type(exc).__name__}: {exc}"
    return None


#: Programs a shell block may call that the suite cannot install: a block calling a missing one
#: is skipped with the reason (and the document's later blocks with it).
PROGRAMS = {
    "mosquitto": "apt-get install mosquitto (scripts/test installs it)",
    "curl": "apt-get install curl",
}


def missing_program(block: Block, env: dict[str, str]) -> str | None:
    """Why ``block`` cannot run here ("needs mosquitto, not installed: ..."), or None. A python
    block needs the modules it imports (tritonclient is in the dev extra, grpc in its own)."""
    if block.language in PYTHON_LANGUAGES:
        for module in re.findall(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", block.text, re.MULTILINE):
            if importlib.util.find_spec(module) is None:
                return f"needs the Python package {module!r}, not installed (scripts/bootstrap installs every extra)"
        return None
    if block.language not in SHELL_LANGUAGES:
        return None
    for program, install in PROGRAMS.items():
        calls = re.search(rf"(^|[\s;&|(]){program}\s", block.text, re.MULTILINE)
        if calls and shutil.which(program, path=env.get("PATH")) is None:
            return f"needs {program}, not installed: {install}"
    return None


BLOCKS = {document: parse_blocks(document) for document in DOCUMENTS}
CASES = [
    pytest.param(document, index, id=f"{block.where}-{block.language}")
    for document, blocks in BLOCKS.items()
    for index, block in enumerate(blocks)
    if block.runs
]


@pytest.fixture(scope="session")
def document_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    runs: dict[Path, DocumentRun] = {}

    def start(document: Path) -> DocumentRun:
        if document not in runs:
            root = tmp_path_factory.mktemp(document.stem)
            (root / "work").mkdir()
            (root / "home").mkdir()
            env = {name: value for name, value in os.environ.items() if not name.startswith("EDGESDK_")}
            env["HOME"] = str(root / "home")
            # The venv first; the sbin folders last, where Debian puts mosquitto (root's PATH has them).
            env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", ""), "/usr/sbin", "/sbin"])
            env.pop("PYTHONPATH", None)
            if any(TRAINS_DIGITS.search(block.text) for block in BLOCKS[document] if block.runs):
                # The document trains the digits CNN into digits/ itself; prepare_digits reuses
                # a trained copy found there, so the session's copy saves the training.
                digits = request.getfixturevalue("digits")
                shutil.copytree(digits.directory, root / "work" / "digits")
            runs[document] = DocumentRun(document, root, {port: _free_port() for port in DOCUMENTED_PORTS}, env)
        return runs[document]

    yield start  # type: ignore[misc]
    for run in runs.values():
        run.close()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize(("document", "index"), CASES)
def test_documented_block(document: Path, index: int, document_runs) -> None:
    blocks = BLOCKS[document]
    block = blocks[index]
    if block.skip_reason is not None:
        pytest.skip(f"{block.where}: {block.skip_reason}")
    if block.language in PARSED_LANGUAGES:
        failure = parse_failure(block)
        if failure:
            pytest.fail(failure, pytrace=False)
        return
    run = document_runs(document)
    try:
        # Every earlier block of the document runs first (once), so that -k on one block works.
        for earlier in range(index):
            previous = blocks[earlier]
            if not previous.runs or previous.skip_reason is not None or previous.language in PARSED_LANGUAGES:
                continue
            missing = missing_program(previous, run.env)
            if missing:
                pytest.skip(f"{block.where}: not run, the earlier block {previous.where} {missing}")
            if earlier not in run.done:
                run.done[earlier] = run.run(earlier, previous)
                if run.done[earlier]:
                    pytest.fail(f"an earlier block failed:\n{run.done[earlier]}", pytrace=False)
            elif run.done[earlier]:
                pytest.skip(f"{block.where}: not run, the earlier block {previous.where} failed")
        missing = missing_program(block, run.env)
        if missing:
            pytest.skip(f"{block.where}: {missing}")
        run.done[index] = run.run(index, block)
        if run.done[index]:
            pytest.fail(run.done[index], pytrace=False)
    finally:
        # The document's last block that runs stops what its blocks left running, so an agent
        # does not serve on while the next documents run (the session's end is the fallback).
        executed = [
            i for i, b in enumerate(blocks) if b.runs and b.skip_reason is None and b.language not in PARSED_LANGUAGES
        ]
        if index == executed[-1]:
            run.close()


#: Untagged blocks that start like a command must be synopses: they show [options], ... or |.
_COMMAND_START = re.compile(r"^(sudo\s+)?((edgesdk|edge-agent|pip|python3?|curl|git|mosquitto)(\s|$)|scripts/\S)")
_SYNOPSIS = re.compile(r"\[|\.\.\.|…|\|")
_DIAGRAM = re.compile("[\u2500-\u257f\u2190-\u21ff\u25b2-\u25c4]")  # box drawing, arrows


@pytest.mark.unit
def test_untagged_blocks_hold_no_commands() -> None:
    """A block of commands gets a language tag (and so runs above); an untagged block is a
    diagram, a tree, output or a synopsis."""
    commands = [
        block.where
        for blocks in BLOCKS.values()
        for block in blocks
        if not block.language
        and not _DIAGRAM.search(block.text)
        and any(_COMMAND_START.match(line.strip()) for line in block.text.splitlines())
        and not any(_SYNOPSIS.search(line) for line in block.text.splitlines() if _COMMAND_START.match(line.strip()))
    ]
    assert not commands, f"untagged blocks of commands (tag them bash, or mark them as not run): {commands}"


# The runner itself: what it reads as a block, a skip, a command and a port.

_SAMPLE = """# Title

```bash
# not run by the docs tests: needs a Raspberry Pi
ssh pi@pi5.local true
```

1. A step in a list:

   ```python
   print("indented")
   ```

````md
```toml
not a block of its own
```
````

```console
$ edge-agent run --config agent.toml \\
    --verbose
output line
$ curl -s localhost:8470/readyz
```
"""


@pytest.mark.unit
def test_parse_blocks_reads_languages_lines_indents_and_the_skip_marker(tmp_path: Path) -> None:
    document = tmp_path / "sample.md"
    document.write_text(_SAMPLE)
    blocks = parse_blocks(document)
    assert [(b.line, b.language) for b in blocks] == [(3, "bash"), (10, "python"), (14, "md"), (20, "console")]
    assert blocks[0].skip_reason == "needs a Raspberry Pi"
    assert blocks[1].text == 'print("indented")\n' and blocks[1].skip_reason is None
    assert "```toml" in blocks[2].text  # a longer fence holds shorter ones as text
    assert console_commands(blocks[3].text) == (
        "edge-agent run --config agent.toml \\\n    --verbose\ncurl -s localhost:8470/readyz\n"
    )


@pytest.mark.unit
def test_a_failing_block_is_reported_with_its_line_and_output(tmp_path: Path) -> None:
    document = tmp_path / "doc.md"
    document.write_text("```bash\necho before\nfalse\necho after\n```\n")
    (tmp_path / "run" / "work").mkdir(parents=True)
    run = DocumentRun(document, tmp_path / "run", {8470: 18470}, dict(os.environ))
    block = Block(document, 1, "bash", "echo before\nfalse\necho after\n")
    failure = run.run(0, Block(document, 1, "bash", "echo localhost:8470 18470\n"))
    assert failure is None
    assert (tmp_path / "run" / "blocks" / "000-bash.log").read_text() == "localhost:18470 18470\n"
    try:
        failure = run.run(1, block)
    finally:
        run.close()
    assert failure is not None and "doc.md:1 (bash) failed: exit status 1" in failure
    assert "before" in failure and "after" not in failure  # set -e stops at the failing line


@pytest.mark.unit
def test_agent_config_blocks_are_validated_against_the_schema(tmp_path: Path) -> None:
    document = tmp_path / "doc.md"
    assert parse_failure(Block(document, 1, "toml", "[mqtt]\nenabled = true\n")) is None
    failure = parse_failure(Block(document, 1, "toml", "[mqtt]\nenable = true\n"))
    assert failure is not None and "enable" in failure
    assert parse_failure(Block(document, 1, "json", '{"a": [1, ...]}')) is not None


@pytest.mark.unit
def test_a_block_needing_what_is_not_installed_is_skipped_with_the_reason(tmp_path: Path) -> None:
    document = tmp_path / "doc.md"
    env = {"PATH": str(tmp_path)}  # no mosquitto, no curl here
    assert "needs mosquitto" in (missing_program(Block(document, 1, "bash", "mosquitto -p 1883 &\n"), env) or "")
    assert missing_program(Block(document, 1, "bash", "echo mosquitto.log\n"), env) is None
    python = Block(document, 1, "python", "import numpy as np\nfrom no_such_package_here import x\n")
    assert "'no_such_package_here'" in (missing_program(python, env) or "")
