# Stage 4: one training run per (variant, seed), launched with torchrun by speedrun.workflow.launcher:
# on one machine `torchrun --standalone` (a GPU run takes free GPUs through lock files on the local executor),
# on several Slurm nodes one torchrun per node with c10d rendezvous. Training arguments must never be
# abbreviations of torchrun options (torchrun reads `--log` as its --log-dir): hence `--out`.
# Runs start seed by seed, the variants alternating (priority), so that drift hits every variant alike.
# Each process first checks that its node shows the GPUs config.yaml `cluster` asks for
# (speedrun.training.preflight); those settings are not params: a run on other GPUs of the same kind is not a new
# run.
# `exec`: the launcher replaces the job's shell, so that its parent is Snakemake and it dies with Snakemake,
# however Snakemake dies (speedrun.workflow.launcher, "Dying with the workflow"; README "Recovering from a
# crash").

# Before torchrun: every shard's header and size against the manifest (speedrun.data.integrity); a damaged one
# moves the shards folder aside with a one-line error in the log, and the next call rebuilds it.
SHARD_CHECK = shlex.join([sys.executable, "-m", "speedrun.data.integrity"])


rule train:
    output:
        "results/train/{variant}/seed{seed}.txt",
    input:
        shards=get_shards_dir,
        bos=get_bos_dir,
        code=code("speedrun.train"),
    wildcard_constraints:
        variant=variant_pattern(MODEL_VARIANTS),  # a script variant's runs: the run_script rule
    params:
        config=get_train_config_json,
        world_size=lambda w: get_placement(w).world_size,
        device=lambda w: get_placement(w).device,
    threads: lambda w: get_placement(w).procs_per_node
    priority: get_train_priority
    resources:
        gpu=lambda w: get_placement(w).gpus,
        nodes=lambda w: get_placement(w).nodes,
        gres=lambda w: get_placement(w).gres,
        mpi=lambda w: get_placement(w).mpi,
        tasks=lambda w: get_placement(w).tasks,
        tasks_per_gpu=lambda w: get_placement(w).tasks_per_gpu,
    log:
        "logs/train/{variant}/seed{seed}.log",
    shell:
        "{SHARD_CHECK} {input.shards:q} > {log} 2>&1 && "
        "exec {TRAIN_LAUNCHER} run --world-size {params.world_size} --nodes {resources.nodes} "
        "--device {params.device} --gpu-locks {GPU_LOCKS} --label {output:q} -- "
        "speedrun train --config {params.config:q} --variant {wildcards.variant} --seed {wildcards.seed} "
        "--shards-dir {input.shards} --bos-dir {input.bos} --out {output} --compile-cache {COMPILE_CACHE} "
        "--gpu-model={config[cluster][gpu_model]:q} --gpu-memory-gib={config[cluster][gpu_memory_gib]} "
        ">> {log} 2>&1"
