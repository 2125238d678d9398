""".ci/readme_block: CI runs the README's set-up commands as written, taken from the "## Set up" section."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = "```"


def block(readme: Path, n: int) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / ".ci" / "readme_block"), str(readme), str(n)], capture_output=True,
                          text=True)


def readme(tmp_path: Path, *sections: str) -> Path:
    path = tmp_path / "README.md"
    path.write_text("# project\n\n" + "\n".join(sections))
    return path


def bash_block(*lines: str) -> str:
    return "\n".join([f"{FENCE}bash", *lines, FENCE, ""])


def test_the_readme_blocks_install_then_demo_and_test():
    demo, tests = (block(ROOT / "README.md", n) for n in (1, 2))
    assert demo.returncode == tests.returncode == 0, demo.stderr + tests.stderr
    assert demo.stdout.startswith("pip install -e ") and demo.stdout.rstrip().endswith("anyfp4 demo")
    assert tests.stdout.startswith("pip install -e ") and tests.stdout.rstrip().endswith("python -m pytest -q -n auto")


def test_blocks_of_other_sections_and_other_languages_are_not_taken(tmp_path):
    path = readme(tmp_path, "## Intro\n", bash_block("echo intro"),
                  "## Set up\n", f"{FENCE}text\nnot a command\n{FENCE}\n", bash_block("first a", "first b"),
                  "Some prose.\n", bash_block("second"),
                  "## Commands\n", bash_block("echo later"))
    assert block(path, 1).stdout == "first a\nfirst b\n"
    assert block(path, 2).stdout == "second\n"


@pytest.mark.parametrize("sections,n,message", [
    (("## Set up\n", bash_block("only one")), 1, 'the "## Set up" section has 1 ```bash blocks, expected 2'),
    (("## Set up\n", bash_block("a"), bash_block("b"), bash_block("c")), 1, "has 3 ```bash blocks, expected 2"),
    (("## Setup\n", bash_block("a"), bash_block("b")), 1, "has 0 ```bash blocks, expected 2"),
    (("## Set up\n", bash_block("a"), bash_block("  ")), 2, "set-up block 2 holds no command"),
    (("## Set up\n", bash_block("a"), bash_block("b")), 3, "set-up block 3 holds no command"),
])
def test_a_section_that_is_not_two_commands_is_refused(tmp_path, sections, n, message):
    result = block(readme(tmp_path, *sections), n)
    assert result.returncode == 1 and result.stdout == ""
    assert message in result.stderr
