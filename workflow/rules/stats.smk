# Stage 6a: per variant, the one-sided t-test of mean val_loss < target and the train_time summary,
# as statistics.md in the public records' layout and as JSON.


rule stats:
    output:
        summary="results/stats/summary.json",
        markdown=expand("results/stats/{variant}/statistics.md", variant=VARIANTS),
    input:
        records=get_parsed("json"),
        code=code("speedrun.stats"),
    params:
        target=config["stats"]["target"],
        alpha=config["stats"]["alpha"],
        variants=VARIANTS,
    log:
        "logs/stats/stats.log",
    shell:
        "cd results/parse && speedrun stats {params.variants} --target {params.target} "
        "--alpha {params.alpha} --json-out ../../{output.summary} --markdown-dir ../stats "
        "> ../../{log} 2>&1"
