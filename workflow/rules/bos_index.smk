# Stage 3: the BOS (token 50256) positions of every shard, so that training never scans shards at start-up.
# A checkpoint: once it exists, the train rule's input function checks that the shards can feed every
# variant's planned steps, before any training job is scheduled.


checkpoint bos_index:
    output:
        directory("results/bos_index/{dataset}"),
    input:
        shards=rules.tokenize.output[0],
        code=code("speedrun.bos_index"),
    log:
        "logs/bos_index/{dataset}.log",
    shell:
        "speedrun bos-index --shards-dir {input.shards} --out-dir {output} > {log} 2>&1"
