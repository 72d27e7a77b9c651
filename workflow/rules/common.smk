# Shared helpers: config validation, the run table, input functions and planning-time checks.
import dataclasses
import json
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

from speedrun.errors import SpeedrunError, number_text_hint
from speedrun.model.config import PRESETS
from speedrun.workflow.planning import check_training_data, schema_error_message
from speedrun.workflow.sources import module_files
from speedrun.training.config import TrainConfig


# The stages' commands (speedrun, torchrun) are installed beside the Python that runs Snakemake (.venv/bin):
# jobs find them there when that environment is not activated (appended: a PATH entry the user put first wins).
os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), os.path.dirname(sys.executable)])

def fail_planning(message):
    """Stop Snakemake with `message`, one line logged as an error: a refused config or target, while the
    Snakefile is read or from an input function. A ValueError would print Snakemake's frames of this file
    under the message, and from an input function an InputFunctionException with a traceback; SystemExit
    passes through, and Snakemake releases its lock (before any job has started, or after the running ones
    end)."""
    logger.error(message)
    raise SystemExit(1)


# The files this config came from, for messages: config.yaml, any --configfile, then `--config` values given on
# the command line (later ones win).
def _shown_path(path):
    relative = os.path.relpath(str(path))
    return str(path) if relative.startswith("..") else relative


def _config_files_in_reading_order():
    """The Snakefile's config.yaml first (read first), then each --configfile once, in command-line order:
    Snakemake lists the Snakefile's own file last, and again when it is also given with --configfile."""
    own = os.path.join(workflow.basedir, "config.yaml")
    files = [own] + [f for f in workflow.configfiles if os.path.abspath(str(f)) != os.path.abspath(own)]
    return list(dict.fromkeys(os.path.abspath(str(f)) for f in files))


CONFIG_FILES = " + ".join([_shown_path(f) for f in _config_files_in_reading_order()]
                          + (["--config"] if workflow.config_settings.config else []))

try:                               # one line naming the files and the key, not jsonschema's dump of the schema
    validate(config, schema="../schemas/config.schema.yaml")
except WorkflowError as error:
    fail_planning(schema_error_message(CONFIG_FILES, error))

DATASET = config["data"]["name"]
VARIANTS = list(config["variants"])
BASELINE = config["stats"]["baseline"]

if BASELINE not in config["variants"]:
    fail_planning(
        f"{CONFIG_FILES}: stats.baseline is {BASELINE!r}, which is not a variant; "
        f"expected one of the keys of `variants`: {', '.join(VARIANTS)}"
    )
CANDIDATES = [v for v in VARIANTS if v != BASELINE]

# results/stats/compare/ holds the comparisons: a variant of that name would share its folder with them.
if "compare" in VARIANTS:
    fail_planning(f"{CONFIG_FILES}: variants.compare: 'compare' is reserved (results/stats/compare/ holds the "
                  "comparisons); choose another variant name")
for _variant in VARIANTS:       # YAML reads 1.0 as a float, which the schema's integer type accepts
    for _seed in config["variants"][_variant]["seeds"]:
        if not isinstance(_seed, int) or isinstance(_seed, bool):
            fail_planning(f"{CONFIG_FILES}: variants.{_variant}.seeds: {_seed!r} is not an integer; write "
                          f"{int(_seed) if float(_seed).is_integer() else 'a whole number'}")


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
        fail_planning(f"unknown variant {variant!r}: {CONFIG_FILES} `variants` has {', '.join(VARIANTS)}")
    return merge(config["train"], config["variants"][variant].get("train", {}))


def check_train_settings():
    """Refuse, before anything runs, a variant whose training settings `speedrun train` would refuse (an
    unknown or misspelt key, a wrong value, a batch that does not divide, a world_size that does not split
    over its nodes), naming the variant, or the shared `train` section when every variant fails the same way
    there; an unknown key is named where it is written (`train.<key>` or `variants.<variant>.train.<key>`). Then refuse two variants with the same resolved settings
    (check_distinct_variants)."""
    known = sorted([f.name for f in dataclasses.fields(TrainConfig)] + ["nodes"])
    sections = [("train", config["train"])] + [(f"variants.{v}.train", config["variants"][v].get("train") or {})
                                               for v in VARIANTS]
    for where, section in sections:
        for key in section:
            if key not in known:
                fail_planning(f"{CONFIG_FILES}: {where}.{key}: unknown training setting; expected one of "
                              f"{', '.join(known)}")
    try:
        TrainConfig.from_dict({k: v for k, v in config["train"].items() if k != "nodes"})
        shared_error = None
    except SpeedrunError as e:
        shared_error = str(e)
    for variant in VARIANTS:
        try:
            resolved_train_settings(variant)
        except SpeedrunError as e:
            where = SHARED_TRAIN if str(e) == shared_error else f"variant {variant!r}"
            fail_planning(f"{CONFIG_FILES}: {where}: {e}")
        check_nodes(variant)
    check_distinct_variants()


# Where a refused training setting is written when no variant overrides it.
SHARED_TRAIN = "the shared `train` section (every variant)"


def resolved_train_settings(variant):
    """Every training setting of `variant` as `speedrun train` resolves it (TrainConfig.from_dict: the
    defaults filled in; `dtype: auto` resolved for a `cpu` or `cuda` device, as the log's `config:` header
    shows it; a `model` override equal to the preset's value left out), without `nodes`. A dict of JSON
    values; raises SpeedrunError for a setting TrainConfig refuses."""
    settings = {k: v for k, v in get_train_config(variant).items() if k != "nodes"}
    resolved = TrainConfig.from_dict(settings)
    if resolved.device in ("cpu", "cuda"):
        resolved = resolved.resolved_for(resolved.device)
    resolved = json.loads(json.dumps(dataclasses.asdict(resolved)))
    resolved["model"] = model_overrides_that_change(resolved["preset"], resolved["model"])
    return resolved


def model_overrides_that_change(preset, overrides):
    """The `model` overrides whose value differs from the preset's (`n_layer: 4` on the tiny preset changes
    nothing). `rotary_positions` always stays: written out, it stops the rotary tables being sized to the
    schedule (TrainConfig.model_config)."""
    defaults = json.loads(json.dumps(dataclasses.asdict(PRESETS[preset])))
    return {k: v for k, v in overrides.items() if k == "rotary_positions" or defaults.get(k, object()) != v}


def check_nodes(variant):
    """Refuse a variant whose train.world_size does not split evenly over its train.nodes."""
    settings = get_train_config(variant)
    nodes, world_size = settings.get("nodes", 1), settings.get("world_size", 1)
    overrides = config["variants"][variant].get("train") or {}
    where = f"variant {variant!r}" if {"nodes", "world_size"} & overrides.keys() else SHARED_TRAIN
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        fail_planning(f"{CONFIG_FILES}: {where}: train.nodes must be an integer >= 1, got "
                      f"{nodes!r}{number_text_hint(nodes)}")
    if world_size % nodes:
        fail_planning(
            f"{CONFIG_FILES}: {where}: train.world_size {world_size} is not a multiple of train.nodes "
            f"{nodes}; expected world_size = nodes x processes per node (every node runs the same number)"
        )


def check_distinct_variants():
    """Refuse two variants whose resolved training settings (resolved_train_settings) are the same: their
    runs would be the same runs under two names, and the comparison would measure nothing."""
    seen = {}
    for variant in [BASELINE] + CANDIDATES:
        key = get_train_config_json_for(variant)
        if key in seen:
            other = seen[key]
            overrides = json.dumps(config["variants"][variant].get("train") or {}, sort_keys=True)
            must = ("a candidate must differ from the baseline" if other == BASELINE
                    else "each variant must differ from the others")
            fail_planning(
                f"{CONFIG_FILES}: variants {variant} and {other} resolve to the same train settings: "
                f"variants.{variant}.train {overrides} changes nothing (each value is that of `train` or "
                f"TrainConfig's default); {must}"
            )
        seen[key] = variant


def get_train_config_json(wildcards):
    """Canonical JSON of the variant's settings: a params value Snakemake compares as a string."""
    return get_train_config_json_for(wildcards.variant)



# ---- training inputs -------------------------------------------------------------------------------
# Where a run's processes go (world_size processes over `nodes` machines), the resources that make a
# scheduler give it its GPUs, and the order runs start in. README: "Running on GPUs and clusters".

# The launcher of the train rule (workflow/scripts/launch_train.py) and where it keeps GPU lock files: on
# the local executor runs take their GPUs through locks; inside a cluster job (remote execution) the
# scheduler has already given the job its GPUs.
TRAIN_LAUNCHER = shlex.join(
    [sys.executable, os.path.normpath(os.path.join(workflow.current_basedir, "..", "scripts", "launch_train.py"))]
)
GPU_LOCKS = "none" if workflow.remote_exec else "results/.gpu-locks"
# The Inductor/Triton caches every compiled run shares (keyed by graph, code and versions by torch itself),
# so that only the first seed of a model shape pays the cold compile. Not an output of any rule.
COMPILE_CACHE = "results/compile-cache"


def get_shards_dir(wildcards):
    return f"results/shards/{DATASET}"


def get_world_size(wildcards):
    """Processes of one run of the variant, over all nodes (train.world_size)."""
    return int(get_train_config(wildcards.variant).get("world_size", 1))


def get_train_nodes(wildcards):
    """Machines one run of the variant spans (train.nodes); each runs world_size / nodes processes."""
    nodes = int(get_train_config(wildcards.variant).get("nodes", 1))
    world_size = get_world_size(wildcards)
    if world_size % nodes:
        fail_planning(
            f"variant {wildcards.variant!r}: train.world_size {world_size} is not a multiple of train.nodes "
            f"{nodes} (every node runs the same number of processes)"
        )
    return nodes


def get_procs_per_node(wildcards):
    return get_world_size(wildcards) // get_train_nodes(wildcards)


def is_gpu_run(wildcards):
    return get_train_config(wildcards.variant).get("device", "cpu") == "cuda"


def is_multi_node(wildcards):
    return get_train_nodes(wildcards) > 1


def get_train_device(wildcards):
    return get_train_config(wildcards.variant).get("device", "cpu")


def get_train_threads(wildcards):
    """One core per training process of a node (Slurm: --cpus-per-task, unless cpus_per_gpu is set)."""
    return get_procs_per_node(wildcards)


def get_train_gpus(wildcards):
    """GPUs a one-node run holds: the `gpu` resource, which a global limit (the Snakefile's gpu=8, or
    --resources gpu=N) counts so that GPU runs never share GPUs, and which Slurm gets as sbatch --gpus. 0 for
    a CPU run, and for a multi-node run, which asks for GPUs per node instead (get_train_gres)."""
    return get_world_size(wildcards) if is_gpu_run(wildcards) and not is_multi_node(wildcards) else 0


def get_train_gres(wildcards):
    """A multi-node GPU run's GPUs per node, as Slurm GRES (sbatch --gres=gpu:N, which counts per node);
    None (no such resource) otherwise."""
    if is_gpu_run(wildcards) and is_multi_node(wildcards):
        return f"gpu:{get_procs_per_node(wildcards)}"
    return None


def get_train_mpi(wildcards):
    """`srun` for a multi-node run: the Slurm job step then runs the rule's command itself, and the
    launcher starts one torchrun per node with srun. None (no such resource) for one node, whose command
    the executor runs in an `srun -n1` step."""
    return "srun" if is_multi_node(wildcards) else None


def get_train_tasks(wildcards):
    """One Slurm task per node of a multi-node run (sbatch --ntasks); None for one node."""
    return get_train_nodes(wildcards) if is_multi_node(wildcards) else None


def get_train_tasks_per_gpu(wildcards):
    """0 for a multi-node GPU run, so that the Slurm executor does not turn `tasks` into --ntasks-per-gpu
    (snakemake-executor-plugin-slurm issue #316); None otherwise."""
    return 0 if get_train_gres(wildcards) else None


def get_run_order():
    """Every (variant, seed) in the order the runs should start: the first seed of each variant (the
    baseline first), then the second seed of each, and so on. Alternating the variants makes a drift of
    the machines over time (heat, other jobs, a slower node) fall on both sides of a comparison alike."""
    variants = [BASELINE] + CANDIDATES
    rounds = max(len(get_seeds(v)) for v in variants)
    return [(v, get_seeds(v)[i]) for i in range(rounds) for v in variants if i < len(get_seeds(v))]


def get_train_priority(wildcards):
    """Scheduling priority of a run (higher starts first): len(runs) for the first run of get_run_order,
    down to 1 for the last; jobs of other rules keep priority 0."""
    check_multi_node_executor(wildcards.variant)
    order = get_run_order()
    return len(order) - order.index((wildcards.variant, int(wildcards.seed)))


def check_multi_node_executor(variant):
    """Refuse a multi-node run (train.nodes > 1) that a run with an executor other than Slurm would start:
    launch_train.py starts its nodes with srun inside a Slurm job. Called from get_train_priority, which
    Snakemake evaluates for every job it will run once the DAG is built, before any job starts (so before
    it removes the outputs of a run it redoes); fail_planning stops it without a traceback. The
    executor is not known while the Snakefile is read, and a dry run (-n) or --touch does not say which one
    the real run will use: those pass."""
    executor = getattr(workflow.executor_plugin, "name", None)
    if workflow.remote_exec or executor in (None, "slurm", "dryrun", "touch"):
        return
    nodes = get_train_config(variant).get("nodes", 1)
    if nodes > 1:
        fail_planning(
            f"{CONFIG_FILES}: variant {variant!r}: train.nodes is {nodes}, but the executor is {executor!r}: a "
            f"multi-node run starts inside a Slurm job; run with --profile profiles/slurm-multinode, or set "
            f"train.nodes to 1 (world_size processes on this machine)"
        )


def get_bos_dir(wildcards):
    """The BOS index folder (a checkpoint), after checking that the data can feed the variant's run."""
    if int(wildcards.seed) not in get_seeds(wildcards.variant):
        fail_planning(
            f"seed {wildcards.seed} is not a seed of variant {wildcards.variant!r} in {CONFIG_FILES} "
            f"(its seeds: {get_seeds(wildcards.variant)})"
        )
    bos_dir = f"results/bos_index/{DATASET}"
    if not os.path.exists(bos_dir) and os.path.exists(f"results/train/{wildcards.variant}/seed{wildcards.seed}.txt"):
        # A run trained on other data (data.name changed): Snakemake does not rerun a job whose output exists
        # while an input waits for a checkpoint that has not run (it looks at such a job again only after the
        # checkpoint ran, and nothing then asks for the checkpoint): "Nothing to be done". As a plain input the
        # BOS index is built and the run redone; speedrun train checks that the data feed its steps at start.
        return bos_dir
    bos_dir = checkpoints.bos_index.get(dataset=DATASET).output[0]
    check_data_suffices(wildcards.variant, get_shards_dir(wildcards), bos_dir)
    return bos_dir


_checked = set()
# The settings speedrun.workflow.planning.check_training_data reads: variants that share them (they usually differ in
# optimizer or model settings only) share one simulation of the loader, which takes about a second at
# FineWeb scale (3,200 steps over 2.4B tokens).
DATA_SHAPE_KEYS = ("steps", "tokens_per_step", "micro_batches", "max_seq_len", "val_tokens", "batch_schedule")


def check_data_suffices(variant, shards_dir, bos_dir):
    """Refuse, at planning time, a variant whose batches the train or validation shards cannot feed."""
    cfg = get_train_config(variant)
    key = (tuple(repr(cfg.get(k)) for k in DATA_SHAPE_KEYS), shards_dir, bos_dir)
    if key not in _checked:
        try:
            check_training_data(cfg, shards_dir, bos_dir, what=f"{CONFIG_FILES}: variant {variant!r}",
                                corpus_fixed=config["data"]["source"] == "embedded")
        except SpeedrunError as e:
            fail_planning(str(e))
        _checked.add(key)


def get_train_config_json_for(variant):
    """The settings `speedrun train` gets: the variant's resolved settings (resolved_train_settings), so that
    a default written out (`dtype: auto`, `muon_lr: 0.05`) gives the same params and reruns nothing; without
    `nodes`, which places the processes but does not change what they compute (a change of nodes reruns
    nothing)."""
    return json.dumps(resolved_train_settings(variant), sort_keys=True, separators=(",", ":"))


# ---- parse, stats, report inputs -----------------------------------------------------------------------


def get_parsed(kind, variant=None):
    """Parsed-run files (`kind` csv or json) of one variant or of all."""
    variants = [variant] if variant else VARIANTS
    return [f"results/parse/{v}/seed{s}.{kind}" for v in variants for s in get_seeds(v)]


def in_parse_dir(paths):
    """`paths` relative to results/parse, where the stats and compare rules run `speedrun` (so that each
    variant's group is named after its folder)."""
    return [os.path.relpath(p, "results/parse") for p in paths]


def get_compare_records(wildcards):
    """The configured runs of the baseline and of the candidate, relative to results/parse (`--only`)."""
    return in_parse_dir(get_parsed("json", BASELINE) + get_candidate_records(wildcards))


def get_candidate_records(wildcards):
    if wildcards.variant == BASELINE:
        fail_planning(f"variant {BASELINE!r} is the baseline: it is not compared with itself")
    return get_parsed("json", wildcards.variant)


def get_bundle_logs(wildcards):
    """The training logs a bundle copies: every run of the baseline and of the candidate."""
    return [f"results/train/{v}/seed{s}.txt" for v in (BASELINE, wildcards.variant) for s in get_seeds(v)]


def get_comparisons():
    return [f"results/stats/compare/{v}.json" for v in CANDIDATES]


# Planning-time checks of the settings (after the helpers they use are defined).
check_train_settings()
