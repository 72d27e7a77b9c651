# Stage 4: one training run per (variant, seed), launched with torchrun.


rule train:
    output:
        "results/train/{variant}/seed{seed}.txt",
    input:
        shards=get_shards_dir,
        bos=get_bos_dir,
        code=code("speedrun.train"),
    params:
        config=get_train_config_json,
        nproc=get_world_size,
    threads: get_train_threads
    resources:
        gpu=get_train_gpus,
    log:
        "logs/train/{variant}/seed{seed}.log",
    shell:
        "OMP_NUM_THREADS=1 torchrun --standalone --nproc_per_node={params.nproc} "
        "--no-python speedrun train --config {params.config:q} --variant {wildcards.variant} "
        "--seed {wildcards.seed} --shards-dir {input.shards} --bos-dir {input.bos} --out {output} "
        "> {log} 2>&1"
