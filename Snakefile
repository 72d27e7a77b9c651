# speedrun: the NanoGPT speedrun as a reproducible pipeline.
#   corpus -> tokenize -> bos_index -> train (variants x seeds) -> parse -> stats / compare -> report
# Run:    snakemake --cores all report
# Report: snakemake --report results/report.html   (after the run, in the same folder)
from snakemake.utils import min_version

min_version("9.27")


configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/corpus.smk"
include: "workflow/rules/tokenize.smk"
include: "workflow/rules/bos_index.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/parse.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/bundle.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
