# What needs Snakemake: the config's validation, the experiment resolved once (speedrun.workflow.planning), the
# wildcards, and the input functions that read the jobs' wildcards and the BOS-index checkpoint.
import os
import shlex
import sys

from snakemake.exceptions import WorkflowError
from snakemake.logging import logger
from snakemake.utils import validate

from speedrun.data.dataset import MANIFEST
from speedrun.errors import SpeedrunError
from speedrun.workflow.planning import (check_config_syntax, check_dataset_named, replace_default_variants,
                                       resolve_experiment, schema_error_message)
from speedrun.workflow.sources import module_files


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

# A key given twice in a --configfile (Snakemake has read it already, keeping the second silently: a variant
# copied under the name of another replaced it) is named with its line, as in config.yaml (Snakefile).
for _path in workflow.config_settings.configfiles or []:
    try:
        check_config_syntax(_path)
    except SpeedrunError as error:
        fail_planning(str(error))

# A --configfile that names `variants` names all of them: config.yaml's `candidate` does not leak into it.
replace_default_variants(config, list(workflow.config_settings.configfiles or []),
                         workflow.config_settings.overwrite_config or {})

try:                               # one line naming the files and the key, not jsonschema's dump of the schema
    validate(config, schema="../schemas/config.schema.yaml")
except WorkflowError as error:
    fail_planning(schema_error_message(CONFIG_FILES, error))

try:                               # every variant's settings merged, validated and resolved once
    check_dataset_named(config, os.path.join(workflow.basedir, "config.yaml"), CONFIG_FILES)
    EXPERIMENT = resolve_experiment(config, CONFIG_FILES)
except SpeedrunError as error:
    fail_planning(str(error))

DATASET = EXPERIMENT.dataset
VARIANTS = list(EXPERIMENT.names)
MODEL_VARIANTS = list(EXPERIMENT.model_variants)      # trained by the train rule (speedrun train)
SCRIPT_VARIANTS = list(EXPERIMENT.script_variants)    # run by the run_script rule (speedrun run-script)
BASELINE = EXPERIMENT.baseline
CANDIDATES = list(EXPERIMENT.candidates)


wildcard_constraints:
    variant="|".join(VARIANTS),
    seed=r"\d+",
    dataset=DATASET,


def variant_pattern(names):
    """A wildcard constraint that matches exactly the variants `names` (and nothing when there are none), so
    that one rule makes each variant's logs: the train rule our model's, the run_script rule the scripts'."""
    return "|".join(names) if names else "(?!)"


def code(module):
    """The package files that the stage module `module` runs (a change to any of them reruns the stage)."""
    return list(module_files(module))


def get_seeds(variant):
    return list(EXPERIMENT.seeds(variant))


def get_variant(wildcards):
    """The resolved variant of a job (speedrun.workflow.planning.Variant)."""
    try:
        return EXPERIMENT.variant(wildcards.variant)
    except SpeedrunError as error:
        fail_planning(str(error))


def get_train_config_json(wildcards):
    """Canonical JSON of the variant's resolved settings: a params value Snakemake compares as a string (a
    default written out gives the same params; `nodes` is not in it, so a change of nodes reruns nothing)."""
    return get_variant(wildcards).params


# ---- training inputs -------------------------------------------------------------------------------
# Where a run's processes go (world_size processes over `nodes` machines), the resources that make a
# scheduler give it its GPUs, and the order runs start in: EXPERIMENT's Placement and run_order. README:
# "Running on GPUs and clusters".

# The launcher of the train rule (speedrun.workflow.launcher) and where it keeps GPU lock files: on
# the local executor runs take their GPUs through locks; inside a cluster job (remote execution) the
# scheduler has already given the job its GPUs.
TRAIN_LAUNCHER = shlex.join([sys.executable, "-m", "speedrun.workflow.launcher"])
GPU_LOCKS = "none" if workflow.remote_exec else "results/.gpu-locks"
# The Inductor/Triton caches every compiled run shares (keyed by graph, code and versions by torch itself),
# so that only the first seed of a model shape pays the cold compile. Not an output of any rule.
COMPILE_CACHE = "results/compile-cache"


def get_shards_dir(wildcards):
    return f"results/shards/{DATASET}"


def get_placement(wildcards):
    return get_variant(wildcards).placement


def get_train_priority(wildcards):
    """Scheduling priority of a run (higher starts first; Experiment.priority); jobs of other rules keep 0."""
    check_multi_node_executor(wildcards.variant)
    return EXPERIMENT.priority(wildcards.variant, int(wildcards.seed))


def check_multi_node_executor(variant):
    """Refuse a multi-node run (train.nodes > 1) that a run with an executor other than Slurm would start:
    the launcher (speedrun.workflow.launcher) starts its nodes with srun inside a Slurm job. Called from
    get_train_priority, which Snakemake evaluates for every job it will run once the DAG is built, before any
    job starts (so before it removes the outputs of a run it redoes); fail_planning stops it without a
    traceback. The
    executor is not known while the Snakefile is read, and a dry run (-n) or --touch does not say which one
    the real run will use: those pass."""
    executor = getattr(workflow.executor_plugin, "name", None)
    if workflow.remote_exec or executor in (None, "slurm", "dryrun", "touch"):
        return
    nodes = EXPERIMENT.variant(variant).placement.nodes
    if nodes > 1:
        fail_planning(
            f"{CONFIG_FILES}: variant {variant!r}: train.nodes is {nodes}, but the executor is {executor!r}: a "
            f"multi-node run starts inside a Slurm job; run with --profile profiles/slurm-multinode, or set "
            f"train.nodes to 1 (world_size processes on this machine)"
        )


def get_script(wildcards):
    """The script of a script variant's run (speedrun.workflow.script_variants.ScriptSpec)."""
    return get_variant(wildcards).script


def get_script_inputs(wildcards):
    """The script and its companion files, or the record log they come from: editing one reruns the runs."""
    return get_script(wildcards).inputs


def get_script_source(wildcards):
    """`speedrun run-script`'s --script/--files or --log arguments, shell-quoted."""
    return shlex.join(get_script(wildcards).source_args)


def get_script_env(wildcards):
    """`speedrun run-script --env` settings (NAME=VALUE), shell-quoted; empty without any."""
    return shlex.join(get_script(wildcards).env_args)


def get_bos_dir(wildcards):
    """The BOS index folder (a checkpoint), after checking that the data can feed the variant's run."""
    try:
        EXPERIMENT.check_seed(wildcards.variant, int(wildcards.seed))
    except SpeedrunError as error:
        fail_planning(str(error))
    bos_dir = f"results/bos_index/{DATASET}"
    trained = os.path.exists(f"results/train/{wildcards.variant}/seed{wildcards.seed}.txt")
    shards_gone = not os.path.exists(os.path.join(get_shards_dir(wildcards), MANIFEST))
    if os.path.exists(bos_dir) and shards_gone or not os.path.exists(bos_dir) and trained:
        # As a plain input, not through the checkpoint, where the checkpoint's answer would be wrong. Shards gone
        # (moved aside as damaged by speedrun train, or deleted) while their BOS index stays: the checkpoint counts
        # as done, and the data check below would read the missing manifest. A run trained on other data
        # (data.name changed): Snakemake does not rerun a job whose output exists while an input waits for a
        # checkpoint that has not run (it looks at such a job again only after the checkpoint ran, and nothing
        # then asks for the checkpoint): "Nothing to be done". Either way the data are built first and the run
        # (re)done; speedrun train checks at start that the data feed its steps.
        return bos_dir
    bos_dir = checkpoints.bos_index.get(dataset=DATASET).output[0]
    try:
        EXPERIMENT.check_data(wildcards.variant, get_shards_dir(wildcards), bos_dir)
    except SpeedrunError as error:
        fail_planning(str(error))
    return bos_dir


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
        others = f"one of {', '.join(CANDIDATES)}" if CANDIDATES else "another variant (there is none)"
        fail_planning(f"{CONFIG_FILES}: variant {BASELINE!r} is stats.baseline: it is not compared with itself; "
                      f"expected a candidate, {others}")
    return get_parsed("json", wildcards.variant)


def get_bundle_logs(wildcards):
    """The training logs a bundle copies: every run of the baseline and of the candidate."""
    return [f"results/train/{v}/seed{s}.txt" for v in (BASELINE, wildcards.variant) for s in get_seeds(v)]


def get_description(wildcards):
    """What the job's variant runs, one line (speedrun.workflow.planning.Experiment.describe): our model's
    settings that differ from the baseline's, or a script variant's script path and sha256."""
    return EXPERIMENT.describe(wildcards.variant)


def get_descriptions():
    """`VARIANT=<what it runs>` of every variant, shell-quoted (the report's --describe)."""
    return shlex.join(f"{v}={EXPERIMENT.describe(v)}" for v in VARIANTS)


def get_comparisons():
    return [f"results/stats/compare/{v}.json" for v in CANDIDATES]

