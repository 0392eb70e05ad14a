"""The README and docs/ say only what exists: every internal link resolves, and every command
they show names a script, module, build target, subcommand and option that exist.

A command is a line of a ```sh/```bash/```console block (or a ``$ ``-prompted line of a plain
block). Each is split at ``&&``, ``;`` and ``|`` into simple commands, and each simple command
is checked by what runs it: ``bash``/``python`` scripts must be files of the repository (a bare
name such as ``train.py`` is the user's own script), ``python -m`` modules must be importable,
``build/...`` executables must be CMake targets, and ``torchmem`` subcommands and their options,
and the pytest plugin's ``--torchmem*`` options, must be ones the code defines.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL_FENCES = {"sh", "bash", "console", "shell"}
PYTHONS = {"python", "python3", "$PYTHON", "venv/bin/python"}
# Programs whose commands are not the repository's to check (their own tools and launchers).
EXTERNAL = {"cmake", "ctest", "pip", "git", "apt-get", "sudo", "env", "cd", "export",
            "ls", "cat", "df", "nvidia-smi", "/usr/bin/time", "time", "clang-format", "clang-tidy",
            "chromium", "valgrind", "mkdir", "for", "do", "done", "dpkg", "echo"}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, fenced = set(), False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            anchors.add(_slug(line.lstrip("#")))
    return anchors


def _links(page: Path) -> list[str]:
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out += [target for target in LINK.findall(line) if not re.match(r"[a-z]+:", target)]
    return out


def _commands(page: Path) -> list[str]:
    """The shell commands shown on ``page``, continuation lines joined."""
    commands, fence, pending = [], None, ""
    for line in page.read_text().splitlines():
        match = FENCE.match(line)
        if match:
            fence = None if fence is not None else match.group(1)
            continue
        if fence is None:
            continue
        if fence in SHELL_FENCES:
            text = line
        elif line.startswith("$ "):
            text = line[2:]
        else:
            continue
        text = pending + text.strip()
        if text.endswith("\\"):
            pending = text[:-1] + " "
            continue
        pending = ""
        if text and not text.startswith("#"):
            commands.append(text)
    return commands + _inline_commands(page)


INLINE_CODE = re.compile(r"`([^`]+)`")
INLINE_PROGRAMS = ("python -m ", "python3 ", "python ", "bash scripts/", "torchrun ", "torchmem ")


def _inline_commands(page: Path) -> list[str]:
    """Commands written inline in prose (`python -m torchmem run train.py`), lines joined."""
    prose, fenced = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            prose.append(line)
    text = " ".join(prose)
    return [code for code in INLINE_CODE.findall(text) if code.startswith(INLINE_PROGRAMS)]


def _simple_commands(command: str) -> list[list[str]]:
    words = shlex.split(command, comments=True)
    simple, current = [], []
    for word in words:
        if word in {"&&", ";", "|", "||"}:
            simple.append(current)
            current = []
        else:
            current.append(word.rstrip(";"))
    simple.append(current)
    # environment assignments (FOO=bar cmd) are not the command
    return [[w for i, w in enumerate(c) if not (re.match(r"^[A-Z_][A-Z0-9_]*=", w) and
                                                all(re.match(r"^[A-Z_][A-Z0-9_]*=", x) for x in c[:i + 1]))]
            for c in simple if c]


def _cmake_targets() -> set[str]:
    targets = set()
    for cmake in ROOT.rglob("CMakeLists.txt"):
        if "build" in cmake.relative_to(ROOT).parts:
            continue
        targets |= set(re.findall(r"add_executable\(\s*([\w\-]+)", cmake.read_text()))
    return targets


def _torchmem_help(subcommand: str | None) -> str:
    """What ``python -m torchmem [subcommand] --help`` prints, run in this process."""
    from torchmem.integrations import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        with contextlib.suppress(SystemExit):
            cli.main([*([subcommand] if subcommand else []), "--help"])
    return out.getvalue()


def _plugin_options() -> set[str]:
    source = (ROOT / "torchmem" / "integrations").glob("pytest*.py")
    return {option for path in source for option in re.findall(r"[\"'](--torchmem[\w\-]*)[\"']", path.read_text())}


def _options_in_source(args: list[str], sources: list[Path], what: str) -> list[str]:
    """Each ``--option`` of a repository program must be spelled in its sources."""
    text = "\n".join(path.read_text(errors="replace") for path in sources)
    options = {a.split("=")[0] for a in args if a.startswith("--")}
    return [f"{what} has no option {o}" for o in sorted(options) if o not in text]


def _problems_of(words: list[str]) -> list[str]:
    program, args = words[0], words[1:]
    if program in {"nice", "srun"}:  # a wrapper: check what it runs
        inner = next((i for i, a in enumerate(args) if a in PYTHONS or a in {"bash", "torchrun"}), None)
        return _problems_of(args[inner:]) if inner is not None else []
    if program == "torchrun":
        if "-m" in args:
            return _problems_of(["python", *args[args.index("-m"):]])
        return []
    if program == "torchmem":
        return _torchmem_problems(args)
    if program in {"bash", "sh"}:
        script = next((a for a in args if not a.startswith("-")), None)
        if script is None:
            return []
        if not (ROOT / script).is_file():
            return [f"no script {script}"]
        return _options_in_source(args[args.index(script) + 1:], [ROOT / script], script)
    if program.startswith("build/"):
        name = Path(program).name
        if name not in _cmake_targets():
            return [f"no CMake target {name} (for {program})"]
        sources = [p for d in ("benchmarks", "tests") for p in (ROOT / d).rglob("*.cc")]
        return _options_in_source(args, sources, program)
    if program in PYTHONS:
        if args[:1] == ["-m"] and len(args) > 1:
            module = args[1]
            if module == "torchmem":
                return _torchmem_problems(args[2:])
            if module == "pytest":
                unknown = {a.split("=")[0] for a in args[2:] if a.startswith("--torchmem")} - _plugin_options()
                return [f"pytest plugin option {o} does not exist" for o in sorted(unknown)]
            return [] if importlib.util.find_spec(module) else [f"no module {module}"]
        script = next((a for a in args if not a.startswith("-")), None)
        if script and "/" in script and not script.startswith(("/", "$")):
            if not (ROOT / script).is_file():
                return [f"no script {script}"]
            # a script's options live in it or in the package beside it (benchmarks/runall/)
            sources = sorted((ROOT / script).parent.rglob("*.py"))
            return _options_in_source(args[args.index(script) + 1:], sources, script)
        return []
    if "/" in program and not program.startswith(("/", "$")) and not program.startswith("build/"):
        return [] if (ROOT / program).exists() else [f"no program {program}"]
    return []


def _torchmem_problems(args: list[str]) -> list[str]:
    top = _torchmem_help(None)
    subcommand = next((a for a in args if not a.startswith("-")), None)
    if subcommand is None:
        return []
    if not re.search(rf"\b{re.escape(subcommand)}\b", top):
        return [f"torchmem has no subcommand {subcommand!r}"]
    options = [a.split("=")[0] for a in args[args.index(subcommand) + 1:] if a.startswith("--")]
    # options after the script are the script's own
    scripted = next((i for i, a in enumerate(args) if a.endswith(".py")), len(args))
    options = [o for o in options if args.index(o) < scripted] if scripted < len(args) else options
    help_text = _torchmem_help(subcommand)
    return [f"torchmem {subcommand} has no option {o}" for o in options if o not in help_text]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_internal_link_resolves(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in _anchors(destination):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: broken links:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_shown_exists(page):
    problems = []
    for command in _commands(page):
        for words in _simple_commands(command):
            if words and words[0] not in EXTERNAL:
                problems += [f"{command}\n    -> {p}" for p in _problems_of(words)]
    assert not problems, f"{page.relative_to(ROOT)}: commands that do not exist:\n" + "\n".join(problems)


def test_the_checks_see_a_missing_script_link_and_option(tmp_path):
    """The checks above can fail: a made-up script, link and option are each caught."""
    page = tmp_path / "page.md"
    page.write_text("[gone](nowhere.md) [anchor](#nothing-here)\n\n# A heading\n\n```sh\n"
                    "bash scripts/no_such_script.sh\npython -m torchmem run --no-such-option train.py\n"
                    "python -m pytest --torchmem-no-such-flag\nbuild/release/no_such_binary\n"
                    "nice -n 19 python3 benchmarks/run_all.py --no-such-benchmark-option\n```\n")
    assert len(_links(page)) == 2 and not (tmp_path / "nowhere.md").exists()
    assert "nothing-here" not in _anchors(page) and "a-heading" in _anchors(page)
    found = [p for c in _commands(page) for w in _simple_commands(c) for p in _problems_of(w)]
    assert found == ["no script scripts/no_such_script.sh", "torchmem run has no option --no-such-option",
                     "pytest plugin option --torchmem-no-such-flag does not exist",
                     "no CMake target no_such_binary (for build/release/no_such_binary)",
                     "benchmarks/run_all.py has no option --no-such-benchmark-option"]
