# Shared helpers: config validation, the run table, input functions and planning-time checks.
import json

from snakemake.utils import validate

from speedrun.planning import check_training_data
from speedrun.sources import module_files


validate(config, schema="../schemas/config.schema.yaml")

DATASET = config["data"]["name"]
VARIANTS = list(config["variants"])
BASELINE = config["stats"]["baseline"]

if BASELINE not in config["variants"]:
    raise ValueError(
        f"config.yaml: stats.baseline is {BASELINE!r}, which is not a variant; "
        f"expected one of the keys of `variants`: {', '.join(VARIANTS)}"
    )
CANDIDATES = [v for v in VARIANTS if v != BASELINE]


wildcard_constraints:
    variant="|".join(VARIANTS),
    seed=r"\d+",
    dataset=DATASET,


def code(module):
    """The package files that the stage module `module` runs (a change to any of them reruns the stage)."""
    return list(module_files(module))


def get_seeds(variant):
    return config["variants"][variant]["seeds"]


def get_runs():
    """Every (variant, seed) of the experiment, in config order."""
    return [(v, s) for v in VARIANTS for s in get_seeds(v)]


def merge(base, overrides):
    """`base` updated with `overrides`, recursively for nested mappings (a variant's `model` overrides)."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def get_train_config(variant):
    """The resolved training settings of `variant`: the shared `train` section with its overrides."""
    if variant not in config["variants"]:
        raise ValueError(f"unknown variant {variant!r}: config.yaml `variants` has {', '.join(VARIANTS)}")
    return merge(config["train"], config["variants"][variant].get("train", {}))


def get_train_config_json(wildcards):
    """Canonical JSON of the variant's settings: a params value Snakemake compares as a string."""
    return get_train_config_json_for(wildcards.variant)



# ---- training inputs -------------------------------------------------------------------------------


def get_shards_dir(wildcards):
    return f"results/shards/{DATASET}"


def get_world_size(wildcards):
    return int(get_train_config(wildcards.variant).get("world_size", 1))


def get_train_threads(wildcards):
    """One core per training process."""
    return get_world_size(wildcards)


def get_train_gpus(wildcards):
    """GPUs a run holds (a `gpu` resource, so that a profile's global limit keeps GPU jobs apart)."""
    cfg = get_train_config(wildcards.variant)
    return get_world_size(wildcards) if cfg.get("device", "cpu") == "cuda" else 0


def get_bos_dir(wildcards):
    """The BOS index folder (a checkpoint), after checking that the data can feed the variant's run."""
    if int(wildcards.seed) not in get_seeds(wildcards.variant):
        raise ValueError(
            f"seed {wildcards.seed} is not a seed of variant {wildcards.variant!r} in config.yaml "
            f"(its seeds: {get_seeds(wildcards.variant)})"
        )
    bos_dir = checkpoints.bos_index.get(dataset=DATASET).output[0]
    check_data_suffices(wildcards.variant, get_shards_dir(wildcards), bos_dir)
    return bos_dir


_checked = set()


def check_data_suffices(variant, shards_dir, bos_dir):
    """Refuse, at planning time, a variant whose batches the train or validation shards cannot feed."""
    key = (get_train_config_json_for(variant), shards_dir, bos_dir)
    if key not in _checked:
        check_training_data(get_train_config(variant), shards_dir, bos_dir, what=f"variant {variant!r}")
        _checked.add(key)


def get_train_config_json_for(variant):
    return json.dumps(get_train_config(variant), sort_keys=True, separators=(",", ":"))


# ---- parse, stats, report inputs -----------------------------------------------------------------------


def get_parsed(kind, variant=None):
    """Parsed-run files (`kind` csv or json) of one variant or of all."""
    variants = [variant] if variant else VARIANTS
    return [f"results/parse/{v}/seed{s}.{kind}" for v in variants for s in get_seeds(v)]


def get_candidate_records(wildcards):
    if wildcards.variant == BASELINE:
        raise ValueError(f"variant {BASELINE!r} is the baseline: it is not compared with itself")
    return get_parsed("json", wildcards.variant)


def get_comparisons():
    return [f"results/stats/compare/{v}.json" for v in CANDIDATES]
