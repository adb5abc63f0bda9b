"""TW900 unreadable-file: reported by the engine, not by a visitor."""

from __future__ import annotations

from trainwise.doctor.rule import Rule


class UnreadableFile(Rule):
    """A file that cannot be read, decoded or parsed, so no other rule could check it.

    ## What it does
    Reports a path the doctor could not check: a syntax error, a file that is not valid UTF-8 (nor the
    encoding its `# -*- coding -*-` line declares), null bytes or other binary content, a program nested too
    deeply for Python's parser, a folder without read permission, or a symbolic link loop. The other files
    are still checked; the unreadable one is never modified by `--fix`.

    ## Why is this bad?
    A file the doctor cannot parse is a file nobody checked. A syntax error also means the script does not
    run at all.

    ## Example
    ```python
    for x in loader
        print(x)
    ```

    ## Use instead
    ```python
    for x in loader:
        print(x)
    ```

    ## Fix safety
    There is no fix: the file has to be repaired by hand (or excluded with `--ignore TW900` or the `exclude`
    setting).
    """

    code = "TW900"
    name = "unreadable-file"
    message = "cannot read or parse this file"
