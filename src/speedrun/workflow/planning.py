"""Planning-time checks: can the shards feed a run before it is scheduled?

The public BOS-aligned loader once ran out of data mid-run (modded-nanogpt PR #120). The workflow calls
:func:`check_training_data` for every variant as soon as the BOS index exists, before any training job
starts, and refuses a run whose planned steps the train shards cannot feed, or whose validation tokens the
validation shard does not hold. The loader is simulated exactly (no token is copied), so documents cut at
``max_seq_len`` and the tails dropped by BOS alignment are counted.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from speedrun.data.dataset import BOS_ENTRY_KEYS, SHARD_ENTRY_KEYS, check_splits, read_manifest
from speedrun.data.loader import steps_available
from speedrun.errors import SpeedrunError, number_text_hint
from speedrun.optim.schedules import batch_stages
from speedrun.training.data import cut_documents_hint


def schema_error_message(config_files: str, error: BaseException) -> str:
    """One line for a config that fails workflow/schemas/config.schema.yaml: the config files, the dotted
    key, jsonschema's message and, for a number YAML read as text, how to write it (e.g. ``config.yaml:
    stats.target: '4.6e0' is not of type 'number' (text, not a number: ...)``). ``error``: the
    ``jsonschema.ValidationError``, or snakemake's ``WorkflowError`` that carries it (snakemake.utils.
    validate, which raises it while handling the ValidationError, so the latter is its ``__context__``); any
    other error gives its own text after the files."""
    chain = (error, error.__cause__, error.__context__, *getattr(error, "args", ()))
    found = next((a for a in chain if hasattr(a, "absolute_path")), None)
    if found is None:
        return f"{config_files}: {error}"
    key = ".".join(str(part) for part in found.absolute_path) or "(the top level)"
    return f"{config_files}: {key}: {found.message}{number_text_hint(found.instance)}"


def _unique_keys_loader() -> type:
    """A YAML SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently: a
    variant renamed to the name of another replaced it)."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice in one mapping (first at line {seen[key] + 1}); the "
                        "second would replace the first", key_node.start_mark)
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


def check_config_syntax(path: str | Path) -> None:
    """Raise :class:`SpeedrunError` naming ``path``, line and column if the YAML file at ``path`` does not
    parse or gives a key twice in one mapping. Snakemake's own message ("Config file is not valid JSON or
    YAML") names neither the file nor the line, and it keeps the last of two equal keys silently; the
    Snakefile calls this for its config.yaml before Snakemake reads it. A missing file passes (Snakemake
    reports it)."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as e:
        raise SpeedrunError(f"{path}: cannot read the config file ({e})") from None
    try:
        yaml.load(text, Loader=_unique_keys_loader())
    except yaml.MarkedYAMLError as e:
        at = e.problem_mark or e.context_mark
        where = f"line {at.line + 1}, column {at.column + 1}: " if at else ""
        context = e.context or ""
        if e.context_mark and e.problem_mark and e.context_mark.line != e.problem_mark.line:
            context += f" (line {e.context_mark.line + 1}, column {e.context_mark.column + 1})"
        what = "; ".join(p for p in (context, e.problem) if p)
        tabs = " (YAML indents with spaces, not tabs)" if "character '\\t'" in str(e) else ""
        raise SpeedrunError(f"{path}: not valid YAML: {where}{what}{tabs}") from None
    except yaml.YAMLError as e:
        raise SpeedrunError(f"{path}: not valid YAML: {e}") from None


def _setting(cfg: Mapping[str, Any], key: str, what: str) -> int:
    if key not in cfg:
        raise SpeedrunError(f"{what}: training setting `{key}` is missing (expected an integer)")
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpeedrunError(f"{what}: training setting `{key}` is {value!r}; expected a positive integer")
    return value


def check_training_data(cfg: Mapping[str, Any], shards_dir: str | Path, bos_dir: str | Path, what: str,
                        corpus_fixed: bool = False) -> None:
    """Raise :class:`SpeedrunError` unless the shards can feed the run that ``cfg`` describes.

    Args:
        cfg: resolved training settings (config.yaml ``train`` with a variant's overrides); reads ``steps``,
            ``tokens_per_step``, ``micro_batches``, ``max_seq_len``, ``val_tokens`` and the optional
            ``batch_schedule`` (``[tokens_per_step, max_seq_len]`` per equal stage of the steps).
        shards_dir: the tokenize stage's folder (shards and ``manifest.json``).
        bos_dir: the bos_index stage's folder (one ``.npy`` per shard and ``manifest.json``).
        what: names the run in messages (e.g. ``"variant 'baseline'"``).
        corpus_fixed: the corpus cannot grow (the embedded one): a shortage then advises fewer steps or
            tokens per step, or a larger dataset, instead of more train shards.

    Raises:
        SpeedrunError: the batch does not divide into micro-batches; a manifest is missing, not JSON or has a
            shard entry without a key (the file, entry and key are named: :func:`~speedrun.data.dataset.
            read_manifest`, the keys of :data:`~speedrun.data.dataset.SHARD_ENTRY_KEYS` and
            :data:`~speedrun.data.dataset.BOS_ENTRY_KEYS`); the shards are not a validation shard then train
            shards (:func:`~speedrun.data.dataset.check_splits`); the validation shard holds fewer than
            ``val_tokens + 1`` tokens, or the train shards feed fewer than ``steps`` steps (the message says
            how many steps they feed and about how many shards the run needs).
    """
    shards_dir, bos_dir = Path(shards_dir), Path(bos_dir)
    steps = _setting(cfg, "steps", what)
    tokens_per_step = _setting(cfg, "tokens_per_step", what)
    micro_batches = _setting(cfg, "micro_batches", what)
    max_seq_len = _setting(cfg, "max_seq_len", what)
    val_tokens = _setting(cfg, "val_tokens", what)
    stages = batch_stages(steps, [tuple(pair) for pair in cfg.get("batch_schedule") or ()], tokens_per_step,
                          max_seq_len)
    for _, tokens, _ in stages:
        if tokens % micro_batches:
            raise SpeedrunError(
                f"{what}: tokens_per_step {tokens} is not a multiple of micro_batches {micro_batches}"
            )
    shards = read_manifest(shards_dir, "shards", SHARD_ENTRY_KEYS, stage="tokenize")["shards"]
    check_splits(shards_dir, shards)
    val, train = shards[0], shards[1:]
    if val["tokens"] < val_tokens + 1:
        raise SpeedrunError(
            f"{what}: val_tokens is {val_tokens} but the validation shard of {shards_dir} holds {val['tokens']} "
            f"tokens (it needs val_tokens + 1 = {val_tokens + 1}: the targets are the inputs shifted by one)"
        )
    bos = {entry["shard"]: bos_dir / entry["file"]
           for entry in read_manifest(bos_dir, "shards", BOS_ENTRY_KEYS, stage="bos_index")["shards"]}
    missing = [s["file"] for s in train if s["file"] not in bos]
    if missing:
        raise SpeedrunError(f"{bos_dir}/manifest.json: no BOS index for shards {missing}")
    lengths = [s["tokens"] for s in train]
    indices = [np.load(bos[s["file"]], mmap_mode="r") for s in train]
    fed = steps_available(lengths, indices, tokens_per_step // micro_batches, max_seq_len, micro_batches, steps,
                          [(first, tokens // micro_batches, seq_len) for first, tokens, seq_len in stages])
    if fed < steps:
        tokens = sum(lengths)
        shards_needed = math.ceil(len(train) * steps / max(fed, 1))
        more = ("use a larger dataset (data.source: fineweb); this corpus cannot grow" if corpus_fixed
                else f"use more data (about {shards_needed} train shards)")
        raise SpeedrunError(
            f"{what}: {steps} steps of {tokens_per_step} tokens (documents cut at max_seq_len {max_seq_len}) "
            f"need more data than the {len(train)} train shards of {shards_dir} hold ({tokens} tokens): they feed "
            f"only {fed} steps. Lower train.steps or train.tokens_per_step, or {more}."
            + cut_documents_hint(fed, tokens_per_step, tokens, max_seq_len)
        )
