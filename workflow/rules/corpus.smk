# Stage 1: documents of the configured source as parquet (a `text` column, the form FineWeb has).


rule corpus:
    output:
        "results/corpus/{dataset}/documents.parquet",
    input:
        code=code("speedrun.corpus"),
    params:
        source=config["data"]["source"],
        shuffle_seed=config["data"]["shuffle_seed"],
    log:
        "logs/corpus/{dataset}.log",
    shell:
        "speedrun corpus --source {params.source} --shuffle-seed {params.shuffle_seed} "
        "--out {output} > {log} 2>&1"
