"""``trainwise doctor``: static checks that find the classic PyTorch training mistakes in a user's own script.

Parses with the standard ``ast`` module and runs every rule in one pass; libcst is used only to apply fixes.
Importing this package never imports torch. Rules live one per file in ``trainwise/doctor/rules/``.
"""

from __future__ import annotations

from trainwise.doctor.engine import Config, FileResult, check_file, check_paths, check_source
from trainwise.doctor.rule import Finding, Fix, FixAvailability, Rule

__all__ = ["Config", "FileResult", "Finding", "Fix", "FixAvailability", "Rule", "check_file", "check_paths",
           "check_source"]
