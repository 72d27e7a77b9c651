# Stage 2: GPT-2 tokenization into .bin shards (validation shard first) with a manifest.


rule tokenize:
    output:
        directory("results/shards/{dataset}"),
    input:
        documents=rules.corpus.output[0],
        code=code("speedrun.tokenize"),
    params:
        shard_tokens=config["data"]["shard_tokens"],
    threads: workflow.cores
    log:
        "logs/tokenize/{dataset}.log",
    shell:
        "speedrun tokenize --documents {input.documents} --dataset {wildcards.dataset} "
        "--shard-tokens {params.shard_tokens} --threads {threads} --out-dir {output} > {log} 2>&1"
