# speedrun: the NanoGPT speedrun as a reproducible pipeline.
#   corpus -> tokenize -> bos_index -> train (variants x seeds) -> parse -> stats / compare -> report
# Run:    snakemake --cores all report
# Report: snakemake --report results/report.html   (after the run, in the same folder)
import os

from snakemake.utils import min_version

from snakemake.logging import logger

from speedrun.errors import SpeedrunError
from speedrun.workflow.planning import check_config_syntax

min_version("9.27")

# The project's own config.yaml, beside this Snakefile, also under `-d DIR` (a path relative to DIR would be
# skipped silently when --configfile is given); --configfile files are read on top of it. A YAML error in it is
# named with its line first, in one line without Snakemake's frames (its own message names neither file nor line).
try:
    check_config_syntax(os.path.join(workflow.basedir, "config.yaml"))
except SpeedrunError as error:
    logger.error(str(error))
    raise SystemExit(1)


configfile: os.path.join(workflow.basedir, "config.yaml")


# The GPUs of this machine, for the scheduler: a training run with train.device cuda holds world_size of them
# (the train rule's `gpu` resource), so runs whose GPUs add up to more than this wait for each other. 8 (the
# speedrun's machine) unless a budget is given: `--resources gpu=N` on the command line or `resources: {gpu: N}`
# in a --profile (profiles/slurm: 64). Only the main Snakemake process schedules; a job's own process keeps none.
if workflow.is_main_process and "gpu" not in workflow.global_resources:
    workflow.register_resource("gpu", 8)


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/corpus.smk"
include: "workflow/rules/tokenize.smk"
include: "workflow/rules/bos_index.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/run_script.smk"
include: "workflow/rules/parse.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/bundle.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
