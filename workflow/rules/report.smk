# Stage 7: results/report/ — the statistics and comparison tables and the plots, each marked for
# `snakemake --report results/report.html`. Its output also goes to the terminal (tee): the report's path and
# the verdicts, the last lines of a workflow that made them.


rule report:
    output:
        summary=report(
            "results/report/summary.md",
            caption="../report/summary.rst",
            category="Tables",  # not "Statistics": the report defines that name for its own panel
        ),
        runs=report(
            "results/report/runs.csv",
            caption="../report/runs.rst",
            category="Tables",  # not "Statistics": the report defines that name for its own panel
        ),
        val_loss=report(
            "results/report/val_loss.png",
            caption="../report/val_loss.rst",
            category="Plots",
        ),
        final=report(
            "results/report/final_val_loss.png",
            caption="../report/final_val_loss.rst",
            category="Plots",
        ),
        band=report(
            "results/report/val_loss_band.png",
            caption="../report/val_loss_band.rst",
            category="Plots",
        ),
        distributions=report(
            "results/report/distributions.png",
            caption="../report/distributions.rst",
            category="Plots",
        ),
        p_by_n=report(
            "results/report/p_value_by_n.png",
            caption="../report/p_value_by_n.rst",
            category="Plots",
        ),
    input:
        summary=rules.stats.output.summary,
        comparisons=get_comparisons(),
        csv=get_parsed("csv"),
        records=get_parsed("json"),
        code=code("speedrun.report"),
    params:
        target=config["stats"]["target"],
        alpha=config["stats"]["alpha"],
        baseline=BASELINE,
        zoom=config["report"]["zoom_last_fraction"],
        describe=get_descriptions(),
        replicates=" ".join(SCRIPT_VARIANTS),
    log:
        "logs/report/report.log",
    shell:
        "speedrun report --runs {input.records} --summary {input.summary} "
        "--comparisons {input.comparisons} --baseline {params.baseline} --target {params.target} "
        "--alpha {params.alpha} --zoom-last-fraction {params.zoom} --describe {params.describe} "
        "--replicates {params.replicates} --out-dir results/report 2>&1 | tee {log}"
