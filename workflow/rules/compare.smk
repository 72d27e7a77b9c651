# Stage 6b: each candidate against the baseline: Welch t-tests on val_loss and train_time, differences of
# the means with 95% confidence intervals, and the record rules check (same data, world size, GPUs, flags), with
# what each side runs (our model's settings that differ, or a script variant's script path and sha256).
# Over the configured seeds only (--only), as stats.


rule compare:
    output:
        json="results/stats/compare/{variant}.json",
        markdown="results/stats/compare/{variant}.md",
    input:
        baseline=get_parsed("json", BASELINE),
        candidate=get_candidate_records,
        code=code("speedrun.compare"),
    params:
        alpha=config["stats"]["alpha"],
        target=config["stats"]["target"],
        baseline=BASELINE,
        records=get_compare_records,
        describe_baseline=EXPERIMENT.describe(BASELINE),
        describe_candidate=get_description,
    log:
        "logs/compare/{variant}.log",
    shell:
        "cd results/parse && speedrun compare {params.baseline} {wildcards.variant} --only {params.records} "
        "--alpha {params.alpha} "
        "--target {params.target} "
        "--describe-baseline {params.describe_baseline:q} --describe-candidate {params.describe_candidate:q} "
        "--json-out ../../{output.json} --markdown-out ../../{output.markdown} > ../../{log} 2>&1"
