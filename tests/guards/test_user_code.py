"""Which files ``trainwise run`` counts as the user's code (where a finding is placed): not torch, trainwise, the
standard library or an installed package; the script or package run always is."""

from __future__ import annotations

import os
import sysconfig

import torch

import trainwise
from trainwise.guards.user_code import UserCode


def test_libraries_are_not_the_users_code_and_the_script_beside_them_is(tmp_path):
    users = UserCode()
    installed = tmp_path / "venv" / "lib" / "python3" / "site-packages" / "accelerate" / "optimizer.py"
    debian = tmp_path / "usr" / "lib" / "python3" / "dist-packages" / "lightning" / "loop.py"
    for path in (torch.__file__, trainwise.__file__, os.__file__, installed, debian,
                 os.path.join(sysconfig.get_paths()["purelib"], "any_package", "train.py"), "<frozen runpy>"):
        assert not users(str(path)), path
    for path in (tmp_path / "train.py", tmp_path / "helpers" / "steps.py", "<string>"):
        assert users(str(path)), path


def test_the_script_or_package_run_is_the_users_code_though_it_be_installed(tmp_path):
    package = tmp_path / "site-packages" / "trainpkg"
    users = UserCode(own=[str(package)])
    assert users(str(package / "train.py")) and users(str(package / "sub" / "loop.py"))
    assert not users(str(tmp_path / "site-packages" / "trainpkg_other" / "train.py"))  # a prefix is no folder
    assert not users(str(tmp_path / "site-packages" / "steplib.py"))
