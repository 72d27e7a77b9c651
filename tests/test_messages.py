"""Messages that used to point the wrong way (issue 22): a seed given through --config, a one-document corpus
cut by max_seq_len, a parquet or JSON lines file without the text column, the schema's relative paths."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from speedrun.data.documents import iter_text_batches
from speedrun.errors import SpeedrunError
from speedrun.workflow.messages import more_data_hint
from speedrun.workflow.planning import check_training_data, schema_error_message
from synthetic_data import write_dataset

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())


def _schema_error(config: dict) -> jsonschema.ValidationError:
    with pytest.raises(jsonschema.ValidationError) as caught:
        jsonschema.validate(config, SCHEMA)
    return caught.value


def test_a_seed_made_text_by_snakemakes_config_is_not_blamed_on_quotes():
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["variants"]["baseline"]["seeds"] = ["0"]     # what --config 'variants={"baseline": {"seeds": [0]}}' gives
    error = _schema_error(config)
    message = schema_error_message("config.yaml + --config", error)
    assert message == ("config.yaml + --config: variants.baseline.seeds.0: '0' is not of type 'integer' (text, not "
                       "a number: Snakemake's --config passes the numbers inside a list or mapping as text, with or "
                       "without quotes; set variants.baseline.seeds.0 in a YAML file given with --configfile)")
    assert "without quotes)" in schema_error_message("config.yaml", error)        # a quoted '0' in a YAML file
    assert "write 0 without quotes" in schema_error_message("config.yaml + other.yaml", error)


@pytest.mark.parametrize("where", ["variant", "dataset"])
def test_a_name_that_is_no_folder_name_is_told_the_rule_in_words(where):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    if where == "variant":
        config["variants"]["my variant"] = config["variants"].pop("candidate")
        key, value = "variants", "my variant"
    else:
        config["data"]["name"] = "my/data"
        key, value = "data.name", "my/data"
    message = schema_error_message("config.yaml", _schema_error(config))
    assert message.startswith(f"config.yaml: {key}: '{value}' does not match ")
    assert message.endswith("(a name is letters, digits, '_' and '-', starting with a letter or digit: it names a "
                            "results/ folder)")


def test_a_one_document_corpus_is_told_to_add_documents_not_shards(tmp_path):
    one_document = (np.arange(40000) % 97 + 1000)
    shards, bos = write_dataset(tmp_path, [one_document], shard_tokens=4096)     # its BOS in the val shard
    settings = {"steps": 4, "tokens_per_step": 512, "micro_batches": 2, "max_seq_len": 128, "val_tokens": 256}
    with pytest.raises(SpeedrunError) as refused:
        check_training_data(settings, shards, bos, what="variant 'v'")
    message = str(refused.value)
    assert "train shards)" not in message
    assert ("use more documents: the train shards hold 0 document start(s) (BOS) and feed 0 steps; each document "
            "feeds a step at most max_seq_len 128 tokens, so 4 steps need at least 16 documents (the same documents "
            "cut into more shards would not help)") in message


def test_the_documents_a_staged_schedule_needs_weigh_each_stages_sequences():
    stages = [(0, 1024, 128), (2, 2048, 256)]        # 8 sequences a step in both stages
    # 40 documents fed 2 steps (16 sequences): all 4 steps (32 sequences) need about 80
    assert more_data_hint(1, 4, 2, 100_000, stages, 40).endswith(
        "feed 2 steps; each document feeds a step at most max_seq_len 128-256 tokens, so 4 steps need about 80 "
        "documents (the same documents cut into more shards would not help)")
    assert "need at least 32 documents" in more_data_hint(1, 4, 0, 100_000, stages, 0)
    assert more_data_hint(2, 4, 2, 4096, stages, 40) == "use more data (about 4 train shards)"   # most tokens read
    assert more_data_hint(2, 4, 2, 100_000, stages, None) == "use more data (about 4 train shards)"  # contiguous


def test_a_file_without_the_text_column_names_the_setting(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": ["ok"]}), path)
    with pytest.raises(SpeedrunError, match=r"no 'text' column; the columns are \['body'\] \(set "
                                            r"data.files.text_column to the one holding the text\)$"):
        list(iter_text_batches(path, "text"))
    lines = tmp_path / "d.jsonl"
    lines.write_text(json.dumps({"body": "ok", "url": "u"}) + "\n")
    with pytest.raises(SpeedrunError, match=r"line 1 has no 'text' field \(set data.files.text_column to the field "
                                            r"holding the text; this line's fields: body, url\)$"):
        list(iter_text_batches(lines, "text"))


def test_the_schema_says_relative_paths_are_read_from_the_working_folder():
    text = (ROOT / "workflow/schemas/config.schema.yaml").read_text()
    assert "relative to the workflow folder" not in text
    assert "relative paths are read from Snakemake's working folder: the `-d` folder when given" in text


def test_seeds_given_as_one_number_are_shown_as_the_list_they_may_mean():
    """`seeds: 3` (three runs, or seed 3?): the schema's "3 is not of type 'array'" says how to write either."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["variants"]["candidate"]["seeds"] = 3
    assert schema_error_message("config.yaml", _schema_error(config)) == (
        "config.yaml: variants.candidate.seeds: 3 is not of type 'array' (seeds is a list, one run per seed: [3] for "
        "seed 3, [0, 1, 2] for 3 runs)")
    config["variants"]["candidate"]["seeds"] = 10
    assert schema_error_message("config.yaml", _schema_error(config)).endswith("[10] for seed 10, [0, 1, ..., 9] for "
                                                                                 "10 runs)")


@pytest.mark.parametrize("text", ["0,1,2", "0, 1, 2", "0 1 2"])
def test_seeds_written_as_text_are_shown_as_the_yaml_list(text):
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["variants"]["candidate"]["seeds"] = text
    assert schema_error_message("config.yaml", _schema_error(config)) == (
        f"config.yaml: variants.candidate.seeds: '{text}' is not of type 'array' (seeds is a YAML list: [0, 1, 2])")
    config["variants"]["candidate"]["seeds"] = "all"                 # no integers: no list to suggest
    assert schema_error_message("config.yaml", _schema_error(config)).endswith("is not of type 'array'")


def test_a_script_variants_boolean_env_value_is_told_to_quote_it():
    """`env: {COMPILE: true}`: YAML reads true as a boolean, which no environment holds (a new user's report:
    the schema's message alone did not say so, as the package's own check does)."""
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["variants"]["candidate"] = {"seeds": [0], "script": {"path": "train_gpt.py", "env": {"COMPILE": True}}}
    assert schema_error_message("config.yaml", _schema_error(config)) == (
        "config.yaml: variants.candidate.script.env.COMPILE: True is not of type 'string', 'number' (the environment "
        "holds text: write true/false in quotes)")
    config["variants"]["candidate"]["script"]["env"] = {"COMPILE": [1]}           # not a boolean: no such hint
    assert schema_error_message("config.yaml", _schema_error(config)).endswith("is not of type 'string', 'number'")
