"""The source closure the workflow uses as rule inputs (a code edit reruns exactly the stages that run it)."""

from pathlib import Path

import pytest

from speedrun.workflow.sources import module_files


def _names(module):
    return {Path(p).as_posix().split("src/speedrun/", 1)[-1] for p in module_files(module)}


def test_train_closure_has_model_and_loader_but_not_analysis():
    names = _names("speedrun.train")
    assert {"train.py", "__init__.py", "errors.py"} <= names
    assert any(n.startswith("model/") for n in names)
    assert any(n.startswith("optim/") for n in names)
    assert "data/loader.py" in names
    assert not any(n.startswith("analysis/") for n in names)
    assert "tokenize.py" not in names


def test_data_stages_never_depend_on_model_code():
    for stage in ("speedrun.corpus", "speedrun.tokenize", "speedrun.bos_index"):
        names = _names(stage)
        assert not any(n.startswith(("model/", "optim/", "analysis/")) for n in names), (stage, names)


def test_relative_imports_are_followed(tmp_path, monkeypatch):
    import speedrun.workflow.sources as sources

    pkg = tmp_path / "speedrun"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import f\n")
    (pkg / "sub" / "a.py").write_text("from ..b import g\n\ndef f():\n    import speedrun.c\n")
    (pkg / "b.py").write_text("")
    (pkg / "c.py").write_text("")
    (pkg / "unused.py").write_text("")
    monkeypatch.setattr(sources, "PACKAGE_DIR", pkg)
    sources.module_files.cache_clear()
    try:
        files = {Path(p).relative_to(pkg).as_posix() for p in sources.module_files("speedrun.sub")}
    finally:
        sources.module_files.cache_clear()
    assert files == {"__init__.py", "sub/__init__.py", "sub/a.py", "b.py", "c.py"}


def test_unknown_module_is_an_error():
    with pytest.raises(ValueError, match="not a module"):
        module_files("speedrun.no_such_stage")
