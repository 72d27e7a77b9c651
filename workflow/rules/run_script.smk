# Stage 4b: one run of a script variant per (variant, seed): a script of its own (a record's train_gpt.py,
# variants.<name>.script) under torchrun, its own log taken as the run's log. Its output is the train rule's
# (results/train/{variant}/seed{seed}.txt), so parse, stats, compare, report and bundle take it as any run; the
# wildcard constraints give each variant to exactly one of the two rules.
# `speedrun run-script` writes the script (and its companion files, or those taken out of the record log named
# in the config) into results/run_script/{variant}/seed{seed}/, links the shards there as the records read them
# (data/fineweb10B/fineweb_{val,train}_*.bin, DATA_PATH), points Inductor and Triton at the variant's cache
# (shared by its runs: only the first pays the compile) and starts torchrun --standalone with world_size
# processes. It is launched as the train rule launches (GPU locks, CUDA_VISIBLE_DEVICES, priority, resources,
# `exec`, dying with the workflow): --own-torchrun, since it starts its torchrun itself.
# Each seed is a replicate: the script draws its own initialization.


rule run_script:
    output:
        "results/train/{variant}/seed{seed}.txt",
    input:
        shards=get_shards_dir,
        script=get_script_inputs,
        code=code("speedrun.run_script"),
    wildcard_constraints:
        variant=variant_pattern(SCRIPT_VARIANTS),
    params:
        source=get_script_source,
        env=get_script_env,
        run_dir=lambda w: f"results/run_script/{w.variant}/seed{w.seed}",
        cache_dir=lambda w: f"{COMPILE_CACHE}/scripts/{w.variant}",
        world_size=lambda w: get_placement(w).world_size,
        device=lambda w: get_placement(w).device,
    threads: lambda w: get_placement(w).procs_per_node
    priority: get_train_priority
    resources:
        gpu=lambda w: get_placement(w).gpus,
        nodes=lambda w: get_placement(w).nodes,
    log:
        "logs/run_script/{variant}/seed{seed}.log",
    shell:
        "{SHARD_CHECK} {input.shards:q} > {log} 2>&1 && "
        "exec {TRAIN_LAUNCHER} run --own-torchrun --world-size {params.world_size} --nodes 1 "
        "--device {params.device} --gpu-locks {GPU_LOCKS} --label {output:q} -- "
        "speedrun run-script {params.source} --shards-dir {input.shards} --run-dir {params.run_dir} "
        "--world-size {params.world_size} --cache-dir {params.cache_dir} --env {params.env} --out {output} "
        ">> {log} 2>&1"
