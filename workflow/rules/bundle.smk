# A ready-to-submit folder for a candidate, in the public records' layout: the logs of the baseline and the
# candidate, a statistics.md for each and a README table. Not part of the default target:
#   snakemake --cores all results/bundle/<candidate>


rule bundle:
    output:
        directory("results/bundle/{variant}"),
    input:
        baseline=get_parsed("json", BASELINE),
        candidate=get_candidate_records,
        logs=get_bundle_logs,
        code=code("speedrun.bundle"),
    params:
        target=config["stats"]["target"],
        alpha=config["stats"]["alpha"],
        baseline=BASELINE,
        only=lambda wildcards, input: " ".join([*input.baseline, *input.candidate]),
        describe_baseline=EXPERIMENT.describe(BASELINE),
        describe_candidate=get_description,
    log:
        "logs/bundle/{variant}.log",
    shell:
        "speedrun bundle --baseline results/parse/{params.baseline} --candidate results/parse/{wildcards.variant} "
        "--only {params.only} --target {params.target} --alpha {params.alpha} "
        "--describe-baseline {params.describe_baseline:q} --describe-candidate {params.describe_candidate:q} "
        "--out {output} > {log} 2>&1"
