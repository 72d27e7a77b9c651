# Stage 6a: per variant, the one-sided t-test of mean val_loss < target and the train_time summary,
# as statistics.md in the public records' layout and as JSON. Over the configured seeds only (--only): a parsed
# run of a seed since removed from the config stays in results/parse/<variant>/ and is not counted.


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
        records=in_parse_dir(get_parsed("json")),
    log:
        "logs/stats/stats.log",
    shell:
        "cd results/parse && speedrun stats {params.variants} --only {params.records} --target {params.target} "
        "--alpha {params.alpha} --json-out ../../{output.summary} --markdown-dir ../stats "
        "> ../../{log} 2>&1"
