# Stage 0: the remote files of a FineWeb source (data.source `fineweb` or `fineweb-gpt2`), one job per file,
# so that files download in parallel, a finished file is never fetched again and a failed job leaves nothing
# under its output name (`speedrun download` stages and checks the file before renaming it).
# Cap parallel downloads with `--resources hub_downloads=N`; nothing here runs at planning time on the network.
from speedrun.download import fineweb_parquet_files, pretokenized_shard_files, repo_slug

HUB_SECTIONS = {"fineweb": "fineweb", "fineweb-gpt2": "fineweb_gpt2"}


def get_hub_section():
    """The config section (`data.fineweb` or `data.fineweb_gpt2`) of the Hub source in use, or None."""
    key = HUB_SECTIONS.get(config["data"]["source"])
    return None if key is None else config["data"][key]


def get_hub_file_names():
    """The repository paths of every remote file the configured source needs, in dataset order."""
    section = get_hub_section()
    if config["data"]["source"] == "fineweb":
        return fineweb_parquet_files(section["config"], section["parquet_files"])
    if config["data"]["source"] == "fineweb-gpt2":
        return pretokenized_shard_files(section["train_shards"])
    return []


def get_downloaded_files():
    """Local paths (results/download/{repo_slug}/{file}) of the configured source's remote files."""
    names = get_hub_file_names()
    return [f"results/download/{repo_slug(get_hub_section()['repo'])}/{name}" for name in names]


def get_download_section(wildcards):
    section = get_hub_section()
    if section is None or repo_slug(section["repo"]) != wildcards.repo_slug:
        raise ValueError(
            f"results/download/{wildcards.repo_slug}/: no such repository in config.yaml (data.source is "
            f"{config['data']['source']!r}; its repository's folder is "
            f"{repo_slug(section['repo']) if section else 'none'})"
        )
    return section


def get_download_repo(wildcards):
    return get_download_section(wildcards)["repo"]


def get_download_revision(wildcards):
    return get_download_section(wildcards)["revision"]


# Downloads run on the machine that runs Snakemake: cluster compute nodes often reach no network.
localrules:
    download_parquet,
    download_shard,


rule download_parquet:
    output:
        "results/download/{repo_slug}/{file}",
    wildcard_constraints:
        repo_slug=r"[^/]+--[^/]+",
        file=r"[\w.-]+(/[\w.-]+)*\.parquet",
    params:
        repo=get_download_repo,
        revision=get_download_revision,
    retries: 2
    resources:
        hub_downloads=1,
    log:
        "logs/download/{repo_slug}/{file}.log",
    shell:
        "speedrun download --repo {params.repo:q} --revision {params.revision:q} --file {wildcards.file:q} "
        "--out {output:q} > {log:q} 2>&1"


rule download_shard:
    output:
        "results/download/{repo_slug}/{shard}",
    wildcard_constraints:
        repo_slug=r"[^/]+--[^/]+",
        shard=r"\w+_(val|train)_\d{6}\.bin",
    params:
        repo=get_download_repo,
        revision=get_download_revision,
    retries: 2
    resources:
        hub_downloads=1,
    log:
        "logs/download/{repo_slug}/{shard}.log",
    shell:
        "speedrun download --repo {params.repo:q} --revision {params.revision:q} --file {wildcards.shard:q} "
        "--out {output:q} > {log:q} 2>&1"
