# Stage 0: the remote files of a FineWeb source (data.source `fineweb` or `fineweb-gpt2`), one job per file,
# so that files download in parallel, a finished file is never fetched again and a failed job leaves nothing
# under its output name (`speedrun download` stages and checks the file before renaming it).
# Cap parallel downloads with `--resources hub_downloads=N`; nothing here runs at planning time on the network.
# No Snakemake `retries`: `speedrun download` retries transient failures itself (429, 408, 5xx, connection
# errors, with backoff: speedrun.data.hub.with_retries), so a job that fails failed for good (a missing file, a
# gated repository, a hash mismatch) and is not run twice more.
# A file lies at results/download/<owner>--<name>/<revision, percent-encoded>/<path in repo> (download_path), so
# a config naming another revision of the same repository downloads beside, never over, the files of the first.
from speedrun.data.hub_paths import (
    download_path,
    fineweb_parquet_files,
    pretokenized_shard_files,
    repo_slug,
    revision_slug,
)

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
    """Local paths (results/download/{repo_slug}/{revision_slug}/{file}) of the configured source's remote files."""
    section = get_hub_section()
    return [download_path(section["repo"], section["revision"], name) for name in get_hub_file_names()]


def get_download_section(wildcards):
    """The config section whose repository and revision the requested download path names."""
    section = get_hub_section()
    wanted = f"{wildcards.repo_slug}/{wildcards.revision_slug}"
    configured = f"{repo_slug(section['repo'])}/{revision_slug(section['revision'])}" if section else None
    if wanted != configured:
        fail_planning(
            f"results/download/{wanted}/: no such repository and revision in config.yaml (data.source is "
            f"{config['data']['source']!r}; its folder is {configured or 'none'})"
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
        "results/download/{repo_slug}/{revision_slug}/{file}",
    wildcard_constraints:
        repo_slug=r"[^/]+--[^/]+",
        revision_slug=r"[^/]+",
        file=r"[\w.-]+(/[\w.-]+)*\.parquet",
    params:
        repo=get_download_repo,
        revision=get_download_revision,
    resources:
        hub_downloads=1,
    log:
        "logs/download/{repo_slug}/{revision_slug}/{file}.log",
    shell:
        "speedrun download --repo {params.repo:q} --revision {params.revision:q} --file {wildcards.file:q} "
        "--out {output:q} > {log:q} 2>&1"


rule download_shard:
    output:
        "results/download/{repo_slug}/{revision_slug}/{shard}",
    wildcard_constraints:
        repo_slug=r"[^/]+--[^/]+",
        revision_slug=r"[^/]+",
        shard=r"\w+_(val|train)_\d{6}\.bin",
    params:
        repo=get_download_repo,
        revision=get_download_revision,
    resources:
        hub_downloads=1,
    log:
        "logs/download/{repo_slug}/{revision_slug}/{shard}.log",
    shell:
        "speedrun download --repo {params.repo:q} --revision {params.revision:q} --file {wildcards.shard:q} "
        "--out {output:q} > {log:q} 2>&1"
