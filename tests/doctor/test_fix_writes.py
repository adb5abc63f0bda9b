"""``--fix`` rewrites files atomically and changes nothing but the fixed code: comments inside the rewritten
expression, every line-ending style, the encoding declaration and BOM, the permission bits; a write that
fails (full disk, ``ulimit -f``, read-only folder) leaves the file as it was and says why in one line."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys

import pytest

from trainwise.cli import main
from trainwise.doctor import fix as fix_module

FIXABLE = "import torch\nmodel = torch.nn.Linear(2, 2)\nmodel.requires_grad = False\n"
FIXED = "import torch\nmodel = torch.nn.Linear(2, 2)\nmodel.requires_grad_(False)\n"
# What str.splitlines splits at but Python does not, inside a string, and \f as indentation on its own line.
SEPARATORS = "s = 'a\u2028b\u2029c\x85d\x1ce\x1df\x1eg\x0bh\x0ci'\n\x0c\nimport torch\n" \
    "é = 1; model = torch.nn.Linear(2, 2)\n"


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(argv, capsys):
    code = main(["doctor", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


# ------------------------------------------------------------------------------------------------ comments
def test_comments_inside_a_multiline_assigned_value_survive(here, capsys):
    """TW110's fix used to rebuild the value from scratch, dropping both comments."""
    path = here / "freeze.py"
    path.write_text(
        "import torch\n"
        "model = torch.nn.Linear(2, 2)\n"
        "model.requires_grad = (  # freeze the whole model\n"
        "    False  # it is only evaluated\n"
        ")\n"
    )
    code, _, _ = _run(["--fix", "freeze.py"], capsys)
    assert code == 0
    assert path.read_text() == (
        "import torch\n"
        "model = torch.nn.Linear(2, 2)\n"
        "model.requires_grad_(  # freeze the whole model\n"
        "    False  # it is only evaluated\n"
        ")\n"
    )


def test_comments_after_the_last_argument_stay_with_it(here, capsys):
    """TW301 adds an argument after one without a trailing comma whose ")" has a line of its own."""
    path = here / "load.py"
    path.write_text('import torch\nckpt = torch.load(\n    "a.pt"  # the best epoch\n    # (not the last)\n)\n')
    code, _, _ = _run(["--fix", "--unsafe-fixes", "load.py"], capsys)
    assert code == 0
    assert path.read_text() == (
        'import torch\nckpt = torch.load(\n    "a.pt",  # the best epoch\n    # (not the last)\n'
        "    weights_only=True\n)\n"
    )


# ------------------------------------------------------------------------------------------------ bytes kept
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["lf", "crlf", "cr"])
def test_every_line_ending_style_is_kept(here, capsys, newline):
    source = (
        "import torch\n"
        "model = torch.nn.Linear(2, 2)\n"
        "model.requires_grad = (  # c1\n"
        "    False  # c2\n"
        ")\n"
        'doc = """two\nlines"""\n'
        "ckpt = torch.load(\n"
        '    "a.pt"  # c3\n'
        ")\n"
    )
    expected = (
        source.replace("model.requires_grad = (", "model.requires_grad_(")
        .replace('"a.pt"  # c3\n', '"a.pt",  # c3\n    weights_only=True\n')
    )
    path = here / "style.py"
    path.write_bytes(source.replace("\n", newline).encode())
    code, _, _ = _run(["--fix", "--unsafe-fixes", "style.py"], capsys)
    assert code == 0
    assert path.read_bytes() == expected.replace("\n", newline).encode()


@pytest.mark.parametrize(
    "before, after",
    [
        # mixed styles: each line keeps its own
        (b"import torch\r\nx = 1\nmodel = torch.nn.Linear(2, 2)\r\nmodel.requires_grad = False\n",
         b"import torch\r\nx = 1\nmodel = torch.nn.Linear(2, 2)\r\nmodel.requires_grad_(False)\n"),
        # a last line ended by a lone CR after LF lines
        (FIXABLE.encode()[:-1] + b"\r", FIXED.encode()[:-1] + b"\r"),
        # no line break at the end
        (FIXABLE.encode()[:-1], FIXED.encode()[:-1]),
        # a UTF-8 BOM with CRLF
        (b"\xef\xbb\xbf" + FIXABLE.replace("\n", "\r\n").encode(),
         b"\xef\xbb\xbf" + FIXED.replace("\n", "\r\n").encode()),
        # an encoding declaration, lone CRs
        (b"# -*- coding: latin-1 -*-\rx = 'caf\xe9'\r" + FIXABLE.replace("\n", "\r").encode(),
         b"# -*- coding: latin-1 -*-\rx = 'caf\xe9'\r" + FIXED.replace("\n", "\r").encode()),
        # line separators of str.splitlines before the fix
        (SEPARATORS.encode() + "é = 2; model.requires_grad = False\n".encode(),
         SEPARATORS.encode() + "é = 2; model.requires_grad_(False)\n".encode()),
    ],
    ids=["mixed", "final-lone-cr", "no-final-newline", "bom-crlf", "latin1-cr", "line-separators"],
)
def test_bytes_outside_the_fix_are_identical(here, capsys, before, after):
    path = here / "f.py"
    path.write_bytes(before)
    code, _, _ = _run(["--fix", "f.py"], capsys)
    assert code == 0
    assert path.read_bytes() == after


def test_a_file_libcst_cannot_reproduce_is_left_alone(here, capsys):
    """libcst drops a form feed on the first line; rather than change that byte, the fix is not applied."""
    path = here / "ff.py"
    data = b"\x0c" + FIXABLE.encode()
    path.write_bytes(data)
    code, out, _ = _run(["--fix", "ff.py"], capsys)
    assert code == 1 and "TW110" in out
    assert path.read_bytes() == data


def test_diff_hunks_count_lines_as_python_does(here, capsys):
    path = here / "d.py"
    path.write_text("s = 'a\u2028b\x0cc\x1cd'\n" + FIXABLE)
    code, out, _ = _run(["--diff", "d.py"], capsys)
    assert code == 1
    assert "@@ -1,4 +1,4 @@\n s = 'a\u2028b\x0cc\x1cd'\n import torch\n" in out
    assert "-model.requires_grad = False\n+model.requires_grad_(False)\n" in out


# ------------------------------------------------------------------------------------------------ atomic writes
def test_permission_bits_are_kept(here, capsys):
    script = here / "run.py"
    script.write_text("#!/usr/bin/env python\n" + FIXABLE)
    script.chmod(0o751)
    code, _, _ = _run(["--fix", "run.py"], capsys)
    assert code == 0
    assert script.read_text() == "#!/usr/bin/env python\n" + FIXED
    assert stat.S_IMODE(script.stat().st_mode) == 0o751


# ------------------------------------------------------------------------------------------------ links
def _victim(here):
    """``elsewhere/victim.py``, outside the project, fixable: what a link in the project points to."""
    (here / "elsewhere").mkdir()
    victim = here / "elsewhere" / "victim.py"
    victim.write_text(FIXABLE)
    (here / "project").mkdir()
    return victim


def test_fix_never_writes_through_a_link_out_of_the_folder_it_was_given(here, capsys):
    """Before (issue 48, item 11): ``project/link.py -> ../elsewhere/victim.py`` and ``--fix --unsafe-fixes
    project`` rewrote the victim, outside the folder named on the command line."""
    victim = _victim(here)
    (here / "project" / "link.py").symlink_to(os.path.join("..", "elsewhere", "victim.py"))
    (here / "project" / "train.py").write_text(FIXABLE)
    code, out, err = _run(["--fix", "--unsafe-fixes", "project"], capsys)
    assert code == 1  # the link's finding is still there
    assert victim.read_text() == FIXABLE
    assert os.readlink(here / "project" / "link.py") == os.path.join("..", "elsewhere", "victim.py")
    assert (here / "project" / "train.py").read_text() == FIXED  # the regular file inside is fixed
    assert err == ("trainwise doctor: skipped project/link.py: it is a symbolic link (to ../elsewhere/victim.py); "
                   "--fix rewrites only regular files inside the paths it is given.\n")
    assert "project/link.py:3:" in out and "Fixed 1 problem in 1 file." in out
    assert sorted(p.name for p in (here / "elsewhere").iterdir()) == ["victim.py"]


def test_fix_never_writes_through_a_linked_folder_out_of_the_folder_it_was_given(here, capsys):
    victim = _victim(here)
    (here / "project" / "vendor").symlink_to(os.path.join("..", "elsewhere"))
    code, _, err = _run(["--fix", "project"], capsys)
    assert code == 1 and victim.read_text() == FIXABLE
    assert err == ("trainwise doctor: skipped project/vendor/victim.py: it is reached through a symbolic link, "
                   "outside project; --fix rewrites only regular files inside the paths it is given.\n")
    # the folder it points to, named itself, is fixed
    assert _run(["--fix", "elsewhere"], capsys)[0] == 0 and victim.read_text() == FIXED


def test_a_link_named_on_the_command_line_is_skipped_and_its_file_fixed_when_named(here, capsys):
    """``doctor --fix *.py`` names every link the glob matches: a link is never followed, named or found."""
    victim = _victim(here)
    (here / "link.py").symlink_to(victim)
    code, _, err = _run(["--fix", "link.py"], capsys)
    assert code == 1 and victim.read_text() == FIXABLE and (here / "link.py").is_symlink()
    assert err.startswith(f"trainwise doctor: skipped link.py: it is a symbolic link (to {victim}); ")
    code, out, err = _run(["--diff", "link.py"], capsys)  # --diff shows what --fix would do: nothing
    assert out == "" and err.startswith("trainwise doctor: skipped link.py:")
    assert _run(["--fix", str(victim)], capsys)[0] == 0 and victim.read_text() == FIXED


def test_a_file_replaced_by_a_link_between_reading_and_writing_is_not_followed(here, capsys, monkeypatch):
    """The file is read, fixed in memory, then swapped for a link to a victim before the write: the victim
    stays as it was, and so does the link."""
    victim = _victim(here)
    script = here / "project" / "train.py"
    script.write_text(FIXABLE)
    real = fix_module.apply_fixes

    def apply_then_swap(source, fixes):
        result = real(source, fixes)
        script.unlink()
        script.symlink_to(victim)
        return result

    monkeypatch.setattr(fix_module, "apply_fixes", apply_then_swap)
    code, _, err = _run(["--fix", "project"], capsys)
    assert victim.read_text() == FIXABLE and script.is_symlink() and os.readlink(script) == str(victim)
    assert code == 1 and err.startswith("trainwise doctor: skipped project/train.py: it is a symbolic link (to ")


def test_write_fixed_replaces_a_link_instead_of_writing_through_it(here):
    """The write itself: a new file renamed over the name, so a link put there at the last moment is replaced,
    never followed (the check before it says why it was skipped; this is what is left if it loses the race)."""
    victim = _victim(here)
    link = here / "project" / "train.py"
    link.symlink_to(victim)
    fix_module.write_fixed(str(link), FIXED.encode())
    assert victim.read_text() == FIXABLE
    assert not link.is_symlink() and link.read_text() == FIXED


def _io_module():
    import trainwise.files

    return trainwise.files


def _temp_files(folder):
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def _fill_the_disk(monkeypatch, code=errno.ENOSPC, after=4096):
    """The atomic writer's temporary file takes ``after`` bytes, then fails as a full disk (or ulimit) does."""
    raw = _io_module()._TempRaw
    real_write = raw.write_to_disk
    written = {}

    def write_to_disk(self, data):
        room = after - written.get(id(self), 0)
        if room <= 0:
            raise OSError(code, os.strerror(code))
        n = real_write(self, bytes(data)[:room])
        written[id(self)] = written.get(id(self), 0) + n
        return n

    monkeypatch.setattr(raw, "write_to_disk", write_to_disk)


def _refuse_new_files(monkeypatch, code):
    """Creating the temporary file fails, as it does in a read-only folder or on a read-only file system."""
    real_open = os.open

    def os_open(path, flags, *args, **kwargs):
        if ".tmp-" in os.fspath(path) and flags & os.O_CREAT:
            raise OSError(code, os.strerror(code), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", os_open)


AGAIN = "run `trainwise doctor --fix` again"


@pytest.mark.parametrize(
    "code, reason",
    [
        (errno.ENOSPC, f"the disk is full; the file is unchanged; free some space and {AGAIN}."),
        (errno.EFBIG, "the file size limit was reached; the file is unchanged; raise the limit (ulimit -f) and "
                      f"{AGAIN}."),
        (errno.EACCES, "the folder is not writable (a fix writes a new file beside the old one and renames it over "
                       f"it); the file is unchanged; make the folder writable and {AGAIN}."),
        (errno.EROFS, f"the file system is read-only; the file is unchanged; copy the files to a writable disk and "
                      f"{AGAIN} there."),
    ],
    ids=["ENOSPC", "EFBIG", "EACCES", "EROFS"],
)
@pytest.mark.slow
def test_a_failed_write_leaves_the_file_unchanged_with_one_line(here, capsys, monkeypatch, code, reason):
    path = here / "x.py"
    path.write_text("x = 1  # a line of padding, to make the file 32 KB as in the report\n" * 480 + FIXABLE)
    before = path.read_bytes()
    if code in (errno.ENOSPC, errno.EFBIG):
        _fill_the_disk(monkeypatch, code, after=len(before) - 8)
    else:
        _refuse_new_files(monkeypatch, code)
    exit_code, out, err = _run(["--fix", "x.py"], capsys)
    assert exit_code == 2 and out == ""
    assert err == f"trainwise doctor: error: could not rewrite x.py: {reason}\n"
    assert path.read_bytes() == before
    assert _temp_files(here) == []


def test_full_disk_reported_by_fsync(here, capsys, monkeypatch):
    """Some file systems (NFS, delayed allocation) report ENOSPC only when the data is flushed."""
    path = here / "x.py"
    path.write_text(FIXABLE)

    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", fsync)
    exit_code, _, err = _run(["--fix", "x.py"], capsys)
    assert exit_code == 2
    assert err.startswith("trainwise doctor: error: could not rewrite x.py: the disk is full; the file is unchanged;")
    assert path.read_text() == FIXABLE
    assert _temp_files(here) == []


def test_the_message_counts_files_fixed_before_the_failure(here, capsys, monkeypatch):
    (here / "a.py").write_text(FIXABLE)
    (here / "b.py").write_text(FIXABLE)
    real = fix_module.write_fixed

    def write_fixed(path, data, **kwargs):
        if path.endswith("b.py"):
            _fill_the_disk(monkeypatch, after=10)
        real(path, data, **kwargs)

    monkeypatch.setattr(fix_module, "write_fixed", write_fixed)
    exit_code, _, err = _run(["--fix", "a.py", "b.py"], capsys)
    assert exit_code == 2
    assert err.startswith("trainwise doctor: error: could not rewrite b.py: the disk is full; the file is unchanged "
                          "(1 other file fixed before it); free some space")
    assert (here / "a.py").read_text() == FIXED and (here / "b.py").read_text() == FIXABLE


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="needs POSIX permissions, not root")
def test_read_only_folder(here, capsys):
    folder = here / "ro"
    folder.mkdir()
    path = folder / "x.py"
    path.write_text(FIXABLE)
    folder.chmod(0o555)
    try:
        exit_code, _, err = _run(["--fix", os.path.join("ro", "x.py")], capsys)
    finally:
        folder.chmod(0o755)
    assert exit_code == 2 and "the folder is not writable" in err and err.count("\n") == 1
    assert path.read_text() == FIXABLE


@pytest.mark.skipif(sys.platform == "win32", reason="needs resource.RLIMIT_FSIZE and SIGXFSZ")
def test_real_file_size_limit(here):
    """Under `ulimit -f` a 29 KB script used to be cut to 8 KB. SIGXFSZ is ignored so that write() fails
    with EFBIG instead of killing the process (what a shell with `ulimit -f` and `trap '' XFSZ` does)."""
    path = here / "big.py"
    body = "import torch\n" + "x = 1  # some padding to make the file larger than the limit\n" * 480 + FIXABLE
    path.write_text(body)
    probe = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))\n"
        "from trainwise.cli import main\n"
        "sys.exit(main(['doctor', '--fix', 'big.py']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=here, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (
        "trainwise doctor: error: could not rewrite big.py: the file size limit was reached; the file is unchanged; "
        f"raise the limit (ulimit -f) and {AGAIN}.\n"
    )
    assert path.read_text() == body
    assert _temp_files(here) == []


def test_fix_does_not_import_torch(here):
    """The atomic writer lives in trainwise.checkpoint, whose package imports torch: --fix must not pay that."""
    (here / "train.py").write_text(FIXABLE)
    probe = (
        "import sys\n"
        "from trainwise.cli import main\n"
        "code = main(['doctor', '--fix', 'train.py', '--format', 'json'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy'))\n"
        "print('HEAVY', heavy, code, file=sys.stderr)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=here, env=env,
                          timeout=120)
    assert "HEAVY [] 0" in proc.stderr, proc.stderr
    assert json.loads(proc.stdout) == []
    assert (here / "train.py").read_text() == FIXED


def test_fix_writes_without_importing_torch(tmp_path):
    """The atomic writer comes from trainwise.files, which imports no torch."""
    script = tmp_path / "s.py"
    script.write_text(FIXABLE)
    code = (
        "import sys\nfrom trainwise.cli import main\n"
        f"assert main(['doctor', '--fix', {str(script)!r}]) == 0\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert script.read_text() == FIXED
