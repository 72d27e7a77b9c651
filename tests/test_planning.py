"""Planning-time checks (`speedrun.workflow.planning.check_training_data`): the manifests of the tokenize and bos-index
stages are read with the key check of `speedrun.data.dataset.read_manifest` (a missing key is named with its file
and entry, not a KeyError), and a shard list without a train shard is refused naming the manifest."""

from __future__ import annotations

import json

import numpy as np
import pytest

from speedrun.errors import SpeedrunError
from speedrun.workflow.planning import (check_config_syntax, check_dataset_named, check_training_data,
                                       match_document_files, replace_default_variants)
from synthetic_data import counting_documents, write_dataset

SETTINGS = {"steps": 4, "tokens_per_step": 512, "micro_batches": 2, "max_seq_len": 128, "val_tokens": 256}


@pytest.fixture()
def dataset(tmp_path):
    """(shards folder, BOS index folder): 300 documents of 21..200 tokens in shards of 4,096 tokens."""
    return write_dataset(tmp_path, counting_documents(300), shard_tokens=4096)


def edit_manifest(directory, edit) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))


def test_a_dataset_that_feeds_the_run_passes_and_one_too_small_is_refused(dataset):
    shards, bos = dataset
    assert len(json.loads((shards / "manifest.json").read_text())["shards"]) >= 3
    check_training_data(SETTINGS, shards, bos, what="variant 'v'")          # raises nothing
    with pytest.raises(SpeedrunError, match=r"variant 'v': 4000 steps of 512 tokens .* they feed only \d+ steps"):
        check_training_data({**SETTINGS, "steps": 4000}, shards, bos, what="variant 'v'")


def test_contiguous_batches_are_counted_as_whole_slices_of_each_train_shard(dataset):
    """train_batches contiguous (record #12's loader): a train shard of n tokens gives (n - 1) // T micro-batches of
    T = tokens_per_step / micro_batches tokens (T + 1 each, one token shared with the next); the check passes at
    exactly that many steps, refuses one more, and counts another number than the BOS-aligned plan."""
    from speedrun.training.data import steps_fed

    shards, bos = dataset
    train = json.loads((shards / "manifest.json").read_text())["shards"][1:]
    T = SETTINGS["tokens_per_step"] // SETTINGS["micro_batches"]
    steps = sum((entry["tokens"] - 1) // T for entry in train) // SETTINGS["micro_batches"]
    cfg = {**SETTINGS, "max_seq_len": T, "train_batches": "contiguous"}
    check_training_data({**cfg, "steps": steps}, shards, bos, what="variant 'v'")          # raises nothing
    with pytest.raises(SpeedrunError, match=rf"variant 'v': {steps + 1} steps of 512 tokens \(contiguous batches\) "
                                            rf".* they feed only {steps} steps\. Lower train.steps or "
                                            r"train.tokens_per_step, or use more data \(about \d+ train shards\)\.$"):
        check_training_data({**cfg, "steps": steps + 1}, shards, bos, what="variant 'v'")
    lengths = [entry["tokens"] for entry in train]
    starts = [np.load(bos / entry["file"].replace(".bin", ".npy")) for entry in train]
    stages = [(0, SETTINGS["tokens_per_step"], T)]
    aligned = steps_fed(10**6, SETTINGS["micro_batches"], stages, lengths, starts)
    assert steps_fed(10**6, SETTINGS["micro_batches"], stages, lengths, starts, "contiguous") == steps != aligned


def test_val_tokens_beyond_the_validation_shard_are_refused_saying_how_many_fit(dataset):
    shards, bos = dataset
    held = json.loads((shards / "manifest.json").read_text())["shards"][0]["tokens"]
    check_training_data({**SETTINGS, "val_tokens": held - 1}, shards, bos, what="variant 'v'")   # the most that fit
    with pytest.raises(SpeedrunError) as refused:
        check_training_data({**SETTINGS, "val_tokens": held}, shards, bos, what="variant 'v'")
    assert str(refused.value) == (
        f"variant 'v': val_tokens is {held} but the validation shard of {shards} holds {held} tokens (it needs "
        f"val_tokens + 1 = {held + 1}: the targets are the inputs shifted by one); lower train.val_tokens to at most "
        f"{held - 1}, or use a larger validation shard")


@pytest.mark.parametrize("folder, key", [(0, "tokens"), (0, "split"), (0, "file"), (1, "shard"), (1, "file")])
def test_a_manifest_entry_without_a_key_is_named(dataset, folder, key):
    directory = dataset[folder]
    edit_manifest(directory, lambda manifest: manifest["shards"][1].pop(key))
    with pytest.raises(SpeedrunError, match=rf"^{directory / 'manifest.json'}: shards\[1\] has no key '{key}' "
                                            r"\(expected file, "):
        check_training_data(SETTINGS, *dataset, what="variant 'v'")


def test_a_validation_shard_alone_is_refused_naming_the_manifest(dataset):
    shards, bos = dataset
    edit_manifest(shards, lambda manifest: manifest.update(shards=manifest["shards"][:1]))
    with pytest.raises(SpeedrunError, match=rf"^{shards / 'manifest.json'}: lists only the validation shard "
                                            r"synth_val_000000.bin and no train shard"):
        check_training_data(SETTINGS, shards, bos, what="variant 'v'")


def test_a_shortage_of_a_fixed_corpus_advises_fewer_steps_or_a_larger_dataset(dataset):
    """A corpus that can grow gets a shard count; the embedded one (corpus_fixed) does not: no number of its
    shards can feed the run, so the message names the keys to lower and a larger dataset instead."""
    shards, bos = dataset
    cfg = {**SETTINGS, "steps": 4000}
    with pytest.raises(SpeedrunError, match=r"Lower train.steps or train.tokens_per_step, or use more data "
                                            r"\(about \d+ train shards\)"):
        check_training_data(cfg, shards, bos, what="variant 'v'")
    with pytest.raises(SpeedrunError) as refused:
        check_training_data(cfg, shards, bos, what="variant 'v'", corpus_fixed=True)
    assert "train shards)" not in str(refused.value)
    assert ("Lower train.steps or train.tokens_per_step, or use a larger dataset (data.source: fineweb); this "
            "corpus cannot grow." in str(refused.value))


@pytest.mark.parametrize("text, message", [
    ("variants:\n  baseline: {seeds: [0, 1}\n",
     r"config.yaml: not valid YAML: line 2, column 26: while parsing a flow sequence; expected ',' or ']', "
     r"but got '}'$"),
    ("train:\n\tsteps: 10\n",
     r"config.yaml: not valid YAML: line 2, column 1: .*found character '\\t' .*\(YAML indents with spaces, "
     r"not tabs\)$"),
    ("variants:\n  baseline:\n    seeds: [0]\n  baseline:\n    seeds: [1]\n",
     r"config.yaml: not valid YAML: line 4, column 3: key 'baseline' given twice in one mapping \(first at line "
     r"2\); the second would replace the first$"),
    ("train: {steps: 10, steps: 20}\n", r"line 1, column 20: key 'steps' given twice in one mapping"),
    ("stats: [\n  1\n",
     r"line 3, column 1: while parsing a flow sequence \(line 1, column 8\); expected ',' or ']'"),
])
def test_a_config_file_that_is_not_yaml_is_named_with_its_line(tmp_path, text, message):
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(SpeedrunError, match=message) as refused:
        check_config_syntax(path)
    assert str(refused.value).startswith(f"{path}: not valid YAML: ")
    path.write_text("train: {steps: 10}\n")
    check_config_syntax(path)                                    # valid YAML passes
    check_config_syntax(tmp_path / "absent.yaml")                # Snakemake names a missing file itself


def _merged(base, *overrides):
    """Snakemake's merge of config files (snakemake.utils.update_config), as the Snakefile sees them."""
    from snakemake.utils import update_config
    import copy

    out = copy.deepcopy(base)
    for o in overrides:
        update_config(out, copy.deepcopy(o))
    return out


DEFAULT = {"variants": {"baseline": {"seeds": [0, 1, 2], "train": {}},
                        "candidate": {"seeds": [0, 1, 2], "train": {"muon_lr": 0.04}}}}


def test_a_configfile_with_variants_replaces_config_yamls_variants(tmp_path):
    own = {"variants": {"baseline": {"seeds": [0], "train": {}},
                        "candidate": {"seeds": [0], "train": {"model": {"bigram_vocab_size": 0}}}}}
    path = tmp_path / "experiment.yaml"
    path.write_text(json.dumps(own))
    command_line = _merged({}, own)
    config = _merged(DEFAULT, command_line)
    assert config["variants"]["candidate"]["train"]["muon_lr"] == 0.04       # Snakemake's merge leaks it
    assert replace_default_variants(config, [path], command_line) is True
    assert config["variants"] == own["variants"]


def test_config_values_on_top_of_a_configfile_still_apply_and_without_one_nothing_changes(tmp_path):
    own = {"variants": {"baseline": {"seeds": [0, 1], "train": {}}}}
    path = tmp_path / "experiment.yaml"
    path.write_text(json.dumps(own))
    other = tmp_path / "other.yaml"
    other.write_text("stats: {target: 3.3}\n")
    dash_config = {"variants": {"baseline": {"seeds": [5]}}}
    command_line = _merged({}, own, dash_config)
    config = _merged(DEFAULT, command_line)
    assert replace_default_variants(config, [other, path], command_line) is True
    assert config["variants"] == {"baseline": {"seeds": [5], "train": {}}}

    command_line = _merged({}, {"stats": {"target": 3.3}}, dash_config)
    config = _merged(DEFAULT, command_line)
    assert replace_default_variants(config, [other], command_line) is False
    assert sorted(config["variants"]) == ["baseline", "candidate"]
    assert config["variants"]["baseline"]["seeds"] == [5]


def test_document_patterns_match_in_order_and_one_that_matches_nothing_is_named(tmp_path, monkeypatch):
    """data.files.paths: each pattern's matches sorted, pattern by pattern, a file once; a pattern matching no
    file (a misspelt path beside good ones was left out of the dataset silently) and an empty list refused."""
    monkeypatch.chdir(tmp_path)
    for name in ("b.txt", "a.txt", "sub/c.jsonl"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    assert match_document_files(["sub/*.jsonl", "*.txt", "b.txt"], "c.yaml") == ["sub/c.jsonl", "a.txt", "b.txt"]
    assert match_document_files(["**/*.jsonl"], "c.yaml") == ["sub/c.jsonl"]
    with pytest.raises(SpeedrunError) as refused:
        match_document_files(["a.txt", "mising.txt"], "config.yaml + c.yaml")
    assert str(refused.value) == (f"config.yaml + c.yaml: data.files.paths: 'mising.txt' matches no file (read from "
                                  f"{tmp_path}); expected a path or glob pattern of existing documents files")
    with pytest.raises(SpeedrunError, match=r"^c.yaml: data.files.paths is empty; data.source 'files' needs glob "):
        match_document_files([], "c.yaml")
    with pytest.raises(SpeedrunError) as refused:
        match_document_files([str(tmp_path / "none" / "*.parquet")], "c.yaml")
    assert "matches no file; expected" in str(refused.value)          # an absolute pattern: no folder named


def test_a_data_source_on_top_of_config_yaml_needs_a_data_set_name_of_its_own(tmp_path):
    """A new-user run: a --configfile with `data: {source: shards, shards: {path: ...}}` alone planned its shards
    and six runs under config.yaml's `shakespeare`. The project's config.yaml's own source, or another name,
    passes."""
    own = tmp_path / "config.yaml"
    own.write_text("data:\n  source: embedded\n  name: shakespeare\n")
    shards = {"data": {"source": "shards", "name": "shakespeare", "shards": {"path": "/data/fineweb10B"}}}
    with pytest.raises(SpeedrunError) as refused:
        check_dataset_named(shards, own, "config.yaml + my.yaml")
    assert str(refused.value) == (
        "config.yaml + my.yaml: data.source is 'shards' but data.name is still config.yaml's 'shakespeare' (its "
        "'embedded' data set's): give this data set a name of its own (data.name, e.g. data: {source: shards, "
        "name: mydata}), so that its shards and runs do not land under results/*/shakespeare")
    check_dataset_named({"data": {**shards["data"], "name": "fineweb"}}, own, "w")
    check_dataset_named({"data": {"source": "embedded", "name": "shakespeare"}}, own, "w")
    check_dataset_named(shards, tmp_path / "absent.yaml", "w")        # nothing to compare with
