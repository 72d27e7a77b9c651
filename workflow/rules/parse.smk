# Stage 5: each training log becomes a per-step metrics table and a result record.


rule parse:
    output:
        csv="results/parse/{variant}/seed{seed}.csv",
        json="results/parse/{variant}/seed{seed}.json",
    input:
        log=rules.train.output[0],
        code=code("speedrun.parse"),
    log:
        "logs/parse/{variant}/seed{seed}.log",
    shell:
        "speedrun parse {input.log} --csv {output.csv} --json {output.json} --seed {wildcards.seed} > {log} 2>&1"
