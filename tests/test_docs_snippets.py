"""Every ```python block of README.md and docs/*.md runs.

A page's blocks run in order in one fresh Python process (a later block may use what an earlier one defined),
in an empty temporary folder. Two HTML comments, on the lines just before a block's fence, change that:

- ``<!-- snippet: setup CODE -->`` runs CODE (one or more lines, hidden from readers) before the block: the
  objects a fragment takes from the reader's own program (``model``, ``optimizer``, ``loader``), kept small;
- ``<!-- snippet: skip (reason) -->`` leaves a block out that cannot run by nature; it must still compile, and
  each one is reported as a skipped test with its reason. Keep them rare: a snippet that is simply wrong is fixed
  instead.

A failing block's traceback names the page and the line of the page (``File "README.md", line 60``).
Pages added under docs/ are picked up by themselves. docs/rules/ is not here: its Example blocks are wrong on
purpose, and tests/doctor/test_rule_docs.py checks that the doctor flags them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from trainwise.progress import format_duration, plural

ROOT = Path(__file__).resolve().parents[1]
MAX_SKIPPED = 3  # skips stay rare; raise this only with a reason in the page's marker

_OPEN = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)[^`]*$")
_MARKER = re.compile(r"<!--\s*snippet:\s*(?P<kind>\w+)(?P<rest>.*?)-->", re.S)


@dataclass
class Block:
    page: str  # relative to the repository root
    line: int  # 1-based line of the block's first line of code in the page
    code: str
    skip: str | None = None  # the reason
    setup: str = ""
    setup_line: int = 0

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _marker_before(lines: list[str], fence: int) -> tuple[re.Match[str], int] | None:
    """The ``<!-- snippet: ... -->`` comment ending on the line before ``fence`` (0-based), with the 0-based line
    where its text starts."""
    end = fence - 1
    if end < 0 or not lines[end].rstrip().endswith("-->"):
        return None
    start = end
    while start >= 0 and "<!--" not in lines[start]:
        start -= 1
    if start < 0:
        return None
    match = _MARKER.fullmatch("\n".join(lines[start : end + 1]).strip())
    return (match, start) if match else None


def _dedent(line: str, indent: int) -> str:
    """``line`` without up to ``indent`` leading spaces (those of an indented fence)."""
    spaces = len(line) - len(line.lstrip(" "))
    return line[min(spaces, indent) :]


def parse_page(path: Path) -> tuple[list[Block], list[str]]:
    """The page's ```python blocks, and the problems of its snippet markers (unknown kind, no reason, a marker
    that belongs to no python block)."""
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, problems, used = [], [], set()
    i = 0
    while i < len(lines):
        opening = _OPEN.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if opening["info"].lower() in ("python", "py"):
            code = "\n".join(_dedent(line, indent) for line in lines[i + 1 : j])
            block = Block(rel, i + 2, code + "\n")
            marker = _marker_before(lines, i)
            if marker is not None:
                match, start = marker
                used.add(start)
                kind, rest = match["kind"], match["rest"]
                if kind == "skip":
                    reason = rest.strip()
                    if not re.fullmatch(r"\(.+\)", reason, re.S):
                        problems.append(f"{block.name}: a skip needs a reason in parentheses: {match[0]!r}")
                    block.skip = reason.strip("()").strip()
                elif kind == "setup":
                    first, _, more = rest.partition("\n")
                    block.setup = "\n".join(part for part in (first.strip(), more.rstrip()) if part) + "\n"
                    block.setup_line = start + 1 if first.strip() else start + 2
                else:
                    problems.append(f"{block.name}: unknown snippet marker {kind!r} (skip or setup)")
            blocks.append(block)
        i = j + 1
    for number, line in enumerate(lines):
        if "<!-- snippet:" in line and number not in used:
            problems.append(f"{rel}:{number + 1}: a snippet marker must end on the line just before a ```python fence")
    return blocks, problems


def _all_blocks() -> list[Block]:
    return [block for page in doc_pages() for block in parse_page(page)[0]]


PAGES = [page for page in doc_pages() if any(not b.skip for b in parse_page(page)[0])]
SKIPPED = [block for block in _all_blocks() if block.skip]

# Runs in the child: each block compiled under the page's own path, its lines where they are in the page, so a
# traceback shows the page's line.
_RUNNER = r"""
import json, sys
namespace = {"__name__": "__main__"}
for block in json.load(open(sys.argv[1], encoding="utf-8")):
    for source, line, what in ((block["setup"], block["setup_line"], "setup of "), (block["code"], block["line"], "")):
        if source.strip():
            print(f"--- running {what}{block['page']}:{block['line']}", file=sys.stderr, flush=True)
            exec(compile("\n" * (line - 1) + source, block["path"], "exec", dont_inherit=True), namespace)
"""


def test_snippet_markers_are_well_formed_and_skips_rare():
    blocks, problems = [], []
    for page in doc_pages():
        found, wrong = parse_page(page)
        blocks += found
        problems += wrong
    assert not problems, "\n".join(problems)
    skipped = [b for b in blocks if b.skip]
    pages = len({b.page for b in blocks})
    print(f"{plural(len(blocks), 'python block')} in {plural(pages, 'page')}: {len(blocks) - len(skipped)} run, "
          f"{len(skipped)} skipped" + "".join(f"\n  skipped {b.name}: {b.skip}" for b in skipped))
    assert len(skipped) <= MAX_SKIPPED, [b.name for b in skipped]
    assert any(b.page == "README.md" for b in blocks)


PARSER_PAGE = """# Page
```python
a = 1
```
<!-- snippet: setup b = 2 -->
```python
c = a + b
```
<!-- snippet: setup
d = 4
-->
  ````py
  s = '''
  ```python
  ```
  '''
  ````
<!-- snippet: skip (runs forever) -->
```python
while True: pass
```
```bash
echo not python
```
<!-- snippet: skip -->
```python
```
<!-- snippet: skip (no block after it) -->

<!-- snippet: tweak -->
```python
```
"""


def test_parser_reads_fences_and_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(PARSER_PAGE, encoding="utf-8")
    blocks, problems = parse_page(page)
    assert [(b.line, b.code, b.skip, b.setup, b.setup_line) for b in blocks] == [
        (3, "a = 1\n", None, "", 0),
        (7, "c = a + b\n", None, "b = 2\n", 5),
        (13, "s = '''\n```python\n```\n'''\n", None, "d = 4\n", 10),
        (20, "while True: pass\n", "runs forever", "", 0),
        (27, "\n", "", "", 0),
        (32, "\n", None, "", 0),
    ]
    assert problems == [
        "page.md:27: a skip needs a reason in parentheses: '<!-- snippet: skip -->'",
        "page.md:32: unknown snippet marker 'tweak' (skip or setup)",
        "page.md:28: a snippet marker must end on the line just before a ```python fence",
    ]


def compile_block(block: Block, path: Path) -> None:
    """Compile ``block`` as the runner would (under the page's path, at the page's lines), without running it."""
    compile("\n" * (block.line - 1) + block.code, str(path), "exec", dont_inherit=True)


@pytest.mark.parametrize("block", SKIPPED or [None], ids=lambda b: b.name if b else "none")
def test_skipped_snippet_compiles(block):
    """A block left out of the run is still Python a reader can paste: it must compile (a SyntaxError fails the
    test and names the page's line); then it is reported as skipped with its reason (``-ra`` lists it). With no
    skipped block there is nothing to compile."""
    if block is None:
        return
    compile_block(block, ROOT / block.page)
    pytest.skip(f"{block.name}: {block.skip}")


def test_a_skipped_block_that_does_not_compile_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n<!-- snippet: skip (needs a GPU) -->\n```python\nfor batch in loader\n```\n",
                    encoding="utf-8")
    (block,) = parse_page(page)[0]
    assert block.skip == "needs a GPU"
    with pytest.raises(SyntaxError) as caught:
        compile_block(block, page)
    assert (caught.value.filename, caught.value.lineno) == (str(page), 5)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_page_snippets_run(page, tmp_path):
    blocks = [b for b in parse_page(page)[0] if not b.skip]
    payload = tmp_path / "blocks.json"
    payload.write_text(json.dumps([{**vars(b), "path": str(page)} for b in blocks]), encoding="utf-8")
    work = tmp_path / "cwd"
    work.mkdir()
    env = {**os.environ, "MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _RUNNER, str(payload)], cwd=work, env=env, capture_output=True,
                          text=True, timeout=600)
    print(f"{page.name}: {plural(len(blocks), 'block')} in {format_duration(time.perf_counter() - started)}")
    assert proc.returncode == 0, (
        f"a snippet of {page.relative_to(ROOT)} failed:\n{proc.stderr[-6000:]}\n(stdout: {proc.stdout[-2000:]})"
    )
