"""The README and the pages of docs/ say what is true: every YAML study in them validates as
written (what a new user copies first), every `workbench` command they show is a real command
with real options, every Python name they show imports where they show it, every link between
them lands, every page of docs/ is reachable from the README, and the code layout table of
docs/architecture.md names the folders of workbench/ one to one."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from workbench.cli import main

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
PACKAGE = ROOT / "workbench"
NOT_PYTHON = {"workbench.status"}  # the MLflow tag a run's status is recorded under
# docs/data.md's study reads a corpus folder beside it and trains a BPE tokenizer on it (15 s);
# tests/tasks/test_text_corpus.py builds that folder and prepares and runs the study end to end.
RUN_ELSEWHERE = {"my-lm"}


def page_name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def study_blocks() -> list[tuple[str, str]]:
    """(page, YAML block) for every block that is a whole study (it has a `name:`)."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```yaml\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            name = re.search(r"^name: *([\w.-]+)", block, flags=re.M)
            if name and name.group(1) not in RUN_ELSEWHERE:
                found.append((page_name(page), block))
    return found


def test_the_readme_has_a_first_study_and_the_docs_have_more():
    pages = [page for page, _ in study_blocks()]
    assert pages.count("README.md") >= 1 and len(pages) >= 4


def test_the_readme_stays_short():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


@pytest.mark.parametrize("index", range(len(study_blocks())),
                         ids=[f"{page}-{i}" for i, (page, _) in enumerate(study_blocks())])
def test_every_study_shown_validates(tmp_path, index):
    page, block = study_blocks()[index]
    path = tmp_path / "study.yaml"
    path.write_text(block, encoding="utf-8")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, f"{page} study #{index}:\n{block}\n{result.output}"
    assert result.output.startswith("ok:")


def shown_commands(text: str) -> list[str]:
    """`workbench SUBCOMMAND ...` lines of bash blocks (continuations joined, comments cut) and
    inline code spans."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.split(r"\s#\s", line, maxsplit=1)[0].strip()
            if line.startswith("workbench "):
                commands.append(line)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    commands += [" ".join(span.split()) for span in re.findall(r"`(workbench [a-z][^`]*)`", text)]
    return commands


def command_mistakes(command: str) -> list[str]:
    """What in one command line is not a subcommand or an option of it."""
    words = command.split()
    sub = main.commands.get(words[1])
    if sub is None:
        return [f"`{command}`: no command `workbench {words[1]}`"]
    options = {opt for param in sub.params for opt in param.opts} | {"--help"}
    return [f"`{command}`: `workbench {words[1]}` has no option {word}"
            for word in re.findall(r"(?<![\w-])--[a-z][a-z-]*", command) if word not in options]


def test_every_command_shown_exists_with_its_options():
    shown = {page_name(page): shown_commands(page.read_text(encoding="utf-8")) for page in PAGES}
    assert len(shown["README.md"]) >= 5 and sum(map(len, shown.values())) >= 40
    mistakes = [f"{page}: {m}" for page, commands in shown.items() for c in commands for m in command_mistakes(c)]
    assert mistakes == []


def test_the_command_check_sees_a_wrong_command_or_option():
    assert shown_commands("```bash\nworkbench run s.yaml \\\n  --jobs 2   # two at once\n```") == [
        "workbench run s.yaml    --jobs 2"]
    assert command_mistakes("workbench run s.yaml --jobs 2 --dry-run") == []
    assert command_mistakes("workbench train s.yaml") != []
    assert command_mistakes("workbench validate s.yaml --jobs 2") != []


def shown_python_names(text: str) -> list[str]:
    """Dotted names (`workbench.run.store.load_results`) and `from workbench... import X` lines."""
    names = re.findall(r"`(workbench(?:\.\w+)+)", text)
    for module, imported in re.findall(r"^from (workbench[\w.]*) import ([\w, ]+)$", text, flags=re.M):
        names += [f"{module}.{name.strip()}" for name in imported.split(",")]
    return sorted(set(names) - NOT_PYTHON)


def resolves(dotted: str) -> bool:
    """The longest importable module prefix of `dotted` has the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


def test_every_python_name_shown_imports_where_it_is_shown():
    assert "workbench.build_model" in shown_python_names(README.read_text(encoding="utf-8"))
    assert "workbench.model.position.PositionScheme" in shown_python_names((DOCS / "plugins.md").read_text(encoding="utf-8"))
    names = {(page_name(page), name) for page in PAGES for name in shown_python_names(page.read_text(encoding="utf-8"))}
    assert [(page, name) for page, name in sorted(names) if not resolves(name)] == []


def test_the_check_sees_a_moved_name():
    assert not resolves("workbench.position.PositionScheme")
    assert not resolves("workbench.model.position.NoSuchScheme")


def anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    headings = re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def links(page: Path) -> list[tuple[Path, str]]:
    """(target file, anchor or '') of each relative Markdown link on a page."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    found = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        found.append(((page.parent / file).resolve() if file else page, anchor))
    return found


def broken_links(page: Path) -> list[str]:
    broken = []
    for target, anchor in links(page):
        if not target.exists():
            broken.append(f"{page_name(page)}: no file {target}")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text(encoding="utf-8")):
            broken.append(f"{page_name(page)}: no heading #{anchor} in {target.name}")
    return broken


def test_every_link_of_the_readme_and_the_docs_lands():
    assert [problem for page in PAGES for problem in broken_links(page)] == []


def test_the_link_check_sees_a_missing_page_or_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Set-up: in `detail`\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#set-up-in-detail) [b](other.md#nowhere) [c](gone.md) [d](https://x.org)",
                    encoding="utf-8")
    assert [target.name for target, _ in links(page)] == ["other.md", "other.md", "gone.md"]
    problems = [problem.split(": ", 1)[1] for problem in broken_links(page)]
    assert problems[0] == "no heading #nowhere in other.md" and problems[1].startswith("no file")
    assert len(problems) == 2


def test_every_test_file_named_exists():
    """The guarantees and the references name the tests that keep them; a moved test is renamed there."""
    named = {(page_name(page), path) for page in PAGES
             for path in re.findall(r"\b(tests/[\w/]+\.py)", page.read_text(encoding="utf-8"))}
    assert len(named) >= 5 and sorted((page, path) for page, path in named if not (ROOT / path).is_file()) == []


def test_every_page_of_docs_is_reachable_from_the_readme():
    """Nothing moved out of the README is lost: each page of docs/ is linked from the README or
    from a page the README reaches."""
    reached, todo = {README}, [README]
    while todo:
        for target, _ in links(todo.pop()):
            if target.suffix == ".md" and target.parent == DOCS and target not in reached:
                reached.add(target)
                todo.append(target)
    assert sorted(page.name for page in PAGES if page not in reached) == []


def layout_rows() -> dict[str, str]:
    """The "Code layout" table of docs/architecture.md: layer -> what its second column says."""
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## Code layout", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    return {layer.strip(): text.strip() for layer, text in rows[1:]}


def test_the_code_layout_table_names_every_folder_and_module():
    rows = layout_rows()
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    by_folder = {}
    for layer, text in rows.items():
        found = sorted(set(re.findall(r"`(\w+)/`", text)) - {"workbench"})  # "in `workbench/` itself"
        assert len(found) <= 1, f"layer {layer}: more than one folder"
        if found:
            by_folder[found[0]] = text
    assert sorted(by_folder) == sorted(folders), "one row per folder of workbench/"
    for folder, text in by_folder.items():
        # a folder of folders (recipes/) names its sub-folders and their modules
        modules = {p.stem for p in (PACKAGE / folder).rglob("*.py")} - {"__init__"}
        modules |= {p.parent.name for p in (PACKAGE / folder).glob("*/__init__.py")}
        named = set(re.findall(r"`([a-z_0-9]+)`", text)) - {"workbench"}  # the command
        root = {p.stem for p in PACKAGE.glob("*.py")}
        assert modules <= named, f"{folder}/: the table does not name {sorted(modules - named)}"
        assert named <= modules | root, f"{folder}/: the table names {sorted(named - modules - root)}, not modules"
    named = {layer: set(re.findall(r"`([a-z_0-9]+)`", rows[layer])) for layer in ("foundation", "interface")}
    assert named["foundation"] | named["interface"] - {"workbench"} == {p.stem for p in PACKAGE.glob("*.py")}


MIN_REPEATED_CHARS = 160  # shorter ones (a caption, a command's one-line gloss) may well recur


def prose_paragraphs(text: str) -> list[str]:
    """The paragraphs of a page, whitespace folded, without code blocks and table rows."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    paragraphs = (" ".join(block.split()) for block in re.split(r"\n\s*\n", text))
    return [p for p in paragraphs if len(p) >= MIN_REPEATED_CHARS and not p.startswith("|")]


def repeated_paragraphs(pages: dict[str, str]) -> dict[str, list[str]]:
    """Each paragraph that more than one page holds, with the pages that hold it."""
    holders: dict[str, list[str]] = {}
    for name, text in pages.items():
        for paragraph in dict.fromkeys(prose_paragraphs(text)):
            holders.setdefault(paragraph, []).append(name)
    return {p[:80]: names for p, names in holders.items() if len(names) > 1}


def test_the_readme_and_the_docs_say_a_thing_once():
    """A paragraph lives on one page; the others link to it (two copies drift apart)."""
    assert repeated_paragraphs({page.name: page.read_text(encoding="utf-8") for page in PAGES}) == {}


def test_the_repeat_check_sees_a_copied_paragraph():
    paragraph = "A variant is one class in one module, registered through its entry point. " * 3
    assert list(repeated_paragraphs({"a.md": paragraph, "b.md": f"# B\n\n{paragraph}\n"}).values()) == [["a.md", "b.md"]]
