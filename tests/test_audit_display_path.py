"""Where a finding's file is shown: a library installed in editable mode (found through an import hook,
not a folder on sys.path) is named by its package path, as site-packages libraries are."""

from __future__ import annotations

import importlib.abc
import importlib.util
import random
import sys

from audit.scan.sources.user_code import display_path


class _EditableFinder(importlib.abc.MetaPathFinder):
    """What `pip install -e` puts on sys.meta_path: one package name mapped to its source folder."""

    def __init__(self, name, folder):
        self.name, self.folder = name, folder

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(fullname, self.folder / "__init__.py",
                                                      submodule_search_locations=[str(self.folder)])


def test_an_editable_package_file_is_shown_by_its_package_path(tmp_path, monkeypatch):
    name = f"edpkg_{random.randrange(10**8)}"
    folder = tmp_path / "src" / name
    (folder / "sub").mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "sub" / "__init__.py").write_text("")
    (folder / "sub" / "cache.py").write_text("def grow(x):\n    return x\n")
    monkeypatch.setattr(sys, "meta_path", [_EditableFinder(name, folder)] + sys.meta_path)
    try:
        mod = importlib.import_module(f"{name}.sub.cache")
        elsewhere = str(tmp_path / "work")
        assert display_path(mod.__file__, elsewhere) == f"{name}/sub/cache.py"
        assert display_path(str(folder / "__init__.py"), elsewhere) == f"{name}/__init__.py"
        # the same folder counted as the target's own: not an install location, the full path stays
        assert display_path(mod.__file__, elsewhere, skip=(str(tmp_path / "src") + "/",)) == str(folder / "sub" / "cache.py")
    finally:
        for m in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[m]


def test_a_file_loaded_under_a_private_name_keeps_its_full_path(tmp_path):
    """A target file is loaded under a private module name no finder serves: shown in full when outside cwd."""
    path = tmp_path / "target.py"
    path.write_text("X = 1\n")
    name = f"_audit_target_probe_{random.randrange(10**8)}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
        assert display_path(str(path), str(tmp_path / "elsewhere")) == str(path.resolve())
    finally:
        del sys.modules[name]
