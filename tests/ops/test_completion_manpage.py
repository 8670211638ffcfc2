"""Shell completion and the manual page, generated from the CLI, used by bash, man
and groff as an operator would."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from lockmq.testing.process import LOCKMQ_COMMAND


def lockmq(*args: str) -> str:
    r = subprocess.run([*LOCKMQ_COMMAND, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("words,cword,expected", [
    (["lockmq", "bro"], 1, {"broker"}),
    (["lockmq", "clusters", "reset", "x", "--dr"], 4, {"--dry-run"}),
    (["lockmq", "broker", "--check"], 2, {"--check-config"}),
    (["lockmq", "devices", "on"], 2, {"online"}),
    (["lockmq", "standby", ""], 2, "promote"),
])
def test_bash_completes_commands_subcommands_and_options(tmp_path, words, cword, expected):
    script = tmp_path / "lockmq.bash"
    script.write_text(lockmq("completion", "bash"))
    array = " ".join(f"'{w}'" for w in words)
    out = subprocess.run(["bash", "-c", f"source {script}; COMP_WORDS=({array}); "
                          f"COMP_CWORD={cword}; _lockmq; printf '%s\\n' \"${{COMPREPLY[@]}}\""],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    got = set(out.stdout.split())
    if isinstance(expected, str):   # an empty word: every choice, this one among them
        assert expected in got, got
    else:
        assert got == expected, got


def test_the_manual_page_renders_and_names_every_command():
    page = lockmq("manpage")
    if shutil.which("groff"):
        r = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z"], input=page, text=True,
                           capture_output=True, timeout=60)
        assert r.returncode == 0 and not r.stderr, r.stderr
    if shutil.which("man"):
        text = subprocess.run(["man", "-l", "-"], input=page, text=True, capture_output=True,
                              timeout=60, env={"MANWIDTH": "100", "PATH": "/usr/bin:/bin"}).stdout
        for command in ("lockmq broker", "lockmq clusters", "lockmq offline",
                        "lockmq completion", "--check-config", "--as-user"):
            assert command in text, command
        assert "%(default)s" not in text
