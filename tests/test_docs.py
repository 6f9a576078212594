"""The documentation stays true: generated pages are fresh, examples run, the site builds.

Conventions for code blocks in ``docs/**/*.md`` and ``README.md``:

- Every ```` ```python ```` block runs as ``python example.py`` would, in a process of its own
  whose working directory is an empty temporary folder, with a timeout of ``BLOCK_TIMEOUT_S``
  seconds. The process is forked from ``tests/docs_runner.py``, which has imported torch and
  trainer once (about 2 s a block saved); where ``os.fork`` is missing, a fresh interpreter.
- ``<!-- no-run -->`` on the line just above the fence skips the block (fragments, method
  bodies, code that needs several processes or a GPU).
- ``<!-- continue -->`` on the line just above the fence runs the block after the page's previous
  runnable blocks, back to the last one without the marker, in the same process (so a page can
  define a module once and use it in the next blocks).
- ``<!-- output -->`` on the line just below the block's closing fence, followed by a fenced
  block, pins what the block prints: its stdout must equal that text (trailing spaces ignored),
  where ``...`` stands for any text (for parts that change as the project grows, such as the
  list of registered strategies in an error message).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import load_module_from_file

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BLOCK_TIMEOUT_S = 120
NO_RUN = "<!-- no-run -->"
CONTINUE = "<!-- continue -->"
OUTPUT = "<!-- output -->"
_SEPARATOR = "----- output of the last block -----"
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<info>[^`]*)$")


@dataclass
class Block:
    """One fenced code block of a page."""

    path: Path
    line: int  # 1-based line of the opening fence
    info: str  # the fence's info string, e.g. "python"
    code: str
    marker: str | None  # the HTML comment just above the fence, if any
    expected_output: str | None = None

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _parse_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with its marker and the output it must print."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        above = lines[index - 1].strip() if index > 0 else ""
        end = index + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        body = [line[indent:] for line in lines[index + 1 : end]]
        blocks.append(
            Block(
                path=path,
                line=index + 1,
                info=match["info"].strip().split(" ")[0],
                code="\n".join(body) + "\n",
                marker=above if above.startswith("<!--") else None,
            )
        )
        index = end + 1
    for block, following in itertools.pairwise(blocks):
        if following.marker == OUTPUT:
            block.expected_output = following.code
    return blocks


def _runnable_blocks() -> list[tuple[Block, list[Block]]]:
    """Each runnable python block with the chain of earlier blocks it continues."""
    pages = sorted(DOCS.rglob("*.md"))
    if (ROOT / "README.md").exists():
        pages.append(ROOT / "README.md")
    runnable: list[tuple[Block, list[Block]]] = []
    for page in pages:
        chain: list[Block] = []
        for block in _parse_blocks(page):
            if block.info != "python" or block.marker == NO_RUN:
                continue
            chain = [*chain, block] if block.marker == CONTINUE else [block]
            runnable.append((block, chain[:-1]))
    return runnable


def _clean_env() -> dict[str, str]:
    """The environment of a docs example: this checkout first on the path, no forced terminal."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")
        and not key.startswith("WANDB_")  # an earlier test's wandb service must not be reused
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["COLUMNS"] = "100"  # rich sizes its tables from this: keeps printed output stable
    env["PYTHONWARNINGS"] = "ignore"
    return env


def _normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def _matches(printed: str, expected: str) -> bool:
    """Whether ``printed`` equals ``expected``, where ``...`` in ``expected`` matches any text."""
    pattern = ".*?".join(re.escape(part) for part in _normalize(expected).split("..."))
    return re.fullmatch(pattern, _normalize(printed), flags=re.DOTALL) is not None


_RUNNABLE = _runnable_blocks()


def test_docs_have_runnable_examples():
    assert len(_RUNNABLE) >= 10, [block.id for block, _ in _RUNNABLE]


class _Runner:
    """Runs example scripts through ``tests/docs_runner.py`` (started on first use)."""

    def __init__(self) -> None:
        self._server: subprocess.Popen[str] | None = None

    def run(self, script: Path) -> tuple[int, str, str]:
        """``python script`` in ``script``'s folder: exit status, stdout, stderr."""
        folder = script.parent
        request = {
            "script": str(script),
            "cwd": str(folder),
            "env": _clean_env(),
            "stdout": str(folder.parent / "stdout.txt"),  # outside the example's folder
            "stderr": str(folder.parent / "stderr.txt"),
            "timeout": BLOCK_TIMEOUT_S,
        }
        server = self._start()
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        response = server.stdout.readline()
        if not response:  # the server itself died: report it, start another next time
            self._server = None
            raise AssertionError(f"tests/docs_runner.py ended: {server.wait()}")
        returncode = json.loads(response)["returncode"]
        out, err = (folder.parent / name for name in ("stdout.txt", "stderr.txt"))
        return returncode, out.read_text(encoding="utf-8"), err.read_text(encoding="utf-8")

    def _start(self) -> subprocess.Popen[str]:
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "docs_runner.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=ROOT,
                env=_clean_env(),
                text=True,
            )
        return self._server

    def close(self) -> None:
        if self._server is not None:
            self._server.stdin.close()  # type: ignore[union-attr]  # its loop ends
            self._server.wait(timeout=60)
            self._server = None


@pytest.fixture(scope="module")
def runner():
    examples = _Runner()
    yield examples
    examples.close()


def _run_fresh(script: Path) -> tuple[int, str, str]:
    """``python script`` in a fresh interpreter (where ``os.fork`` is missing)."""
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=script.parent,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    return result.returncode, result.stdout, result.stderr


@pytest.mark.parametrize(("block", "chain"), _RUNNABLE, ids=[b.id for b, _ in _RUNNABLE])
def test_code_block_runs(block: Block, chain: list[Block], tmp_path: Path, runner: _Runner):
    source = "".join(earlier.code for earlier in chain)
    if chain:
        source += f"print({_SEPARATOR!r}, flush=True)\n"
    source += block.code
    folder = tmp_path / "example"  # the example's own folder: only what it writes is there
    folder.mkdir()
    script = folder / "example.py"
    script.write_text(source, encoding="utf-8")
    returncode, stdout, stderr = runner.run(script) if hasattr(os, "fork") else _run_fresh(script)
    assert returncode == 0, f"{block.id} failed (exit {returncode}):\n{stdout}\n{stderr}"
    if block.expected_output is not None:
        printed = stdout.split(_SEPARATOR + "\n")[-1] if chain else stdout
        assert _matches(printed, block.expected_output), (
            f"{block.id}: the output shown in the docs is not what the block prints:\n"
            f"{_normalize(printed)}"
        )


def test_parser_reads_markers(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- no-run -->\n```python\nskipped()\n```\n\n```python\nprint(1)\n```\n"
        "<!-- output -->\n```text\n1\n```\n<!-- continue -->\n```python\nprint(2)\n```\n",
        encoding="utf-8",
    )
    blocks = _parse_blocks(page)
    assert [b.marker for b in blocks] == [NO_RUN, None, OUTPUT, CONTINUE]
    assert blocks[1].expected_output == "1\n"
    assert blocks[0].code == "skipped()\n"


def test_expected_output_ellipsis():
    assert _matches("one of 'a', 'b', 'c', or x.\n", "one of 'a', ..., or x.")
    assert _matches("tensor(1.)  \n", "tensor(1.)")
    assert not _matches("one of 'a', or y.", "one of 'a', ..., or x.")
    assert not _matches("1\n2", "1")


def test_hook_order_page_is_up_to_date():
    generator = load_module_from_file(ROOT / "scripts" / "gen_hook_order.py")
    assert generator.main(["--check"]) == 0, (
        "docs/hook_order.md is stale: run `python scripts/gen_hook_order.py`"
    )


def test_api_reference_is_up_to_date():
    generator = load_module_from_file(ROOT / "scripts" / "gen_api_reference.py")
    assert generator.main(["--check"]) == 0, (
        "docs/api is stale: run `python scripts/gen_api_reference.py`"
    )
    pages = generator.render()
    import trainer.callbacks

    for name in [*trainer.__all__, *trainer.callbacks.__all__]:  # every public name has an entry
        assert any(f".{name}\n" in text for text in pages.values()), name


def test_mkdocs_build_strict(tmp_path: Path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    pytest.importorskip("mkdocstrings")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "index.html").exists()
    api_page = (tmp_path / "site" / "api" / "trainer" / "index.html").read_text(encoding="utf-8")
    assert "gradient_clip_val" in api_page  # the reference was rendered from the docstrings
    assert "accumulate_grad_batches" in api_page
