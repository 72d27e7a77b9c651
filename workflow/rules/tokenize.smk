# Stage 2: GPT-2 tokenization into .bin shards (validation shard first) with a manifest, by data.source:
#   embedded      the corpus stage's documents.parquet, in one job;
#   fineweb/files one `tokenize_file` job per input file writes that file's token stream (an interrupted run
#                 resumes at file granularity), then `tokenize` cuts the streams, in order, into shards;
#   fineweb-gpt2  the downloaded shards (download.smk), checked and linked in as they are;
#   shards        a folder of shards already on disk (data.shards.path), checked and linked where they are
#                 (symbolic links; the manifest records their paths and sha256), never copied.
# Both ways give the bytes modded-nanogpt's data/fineweb.py gives for the same documents in the same order.
import shlex

from speedrun.data.documents import SUFFIXES, document_format
from speedrun.data.shard_folder import list_shard_folder
from speedrun.workflow.planning import match_document_files, shards_path


def get_document_files():
    """The input files of the `fineweb` and `files` sources, in dataset order ([] for the others)."""
    source = config["data"]["source"]
    if source == "fineweb":
        return get_downloaded_files()
    if source != "files":
        return []
    try:
        files = match_document_files(config["data"]["files"]["paths"], CONFIG_FILES)
    except SpeedrunError as e:
        fail_planning(str(e))
    for f in files:     # now, not when its job runs after the files before it
        if not os.path.isfile(f):
            fail_planning(f"{CONFIG_FILES}: data.files.paths: {f} is not a file (a folder?); expected documents "
                          f"files ({', '.join(sorted(SUFFIXES))})")
        try:
            document_format(f)
        except SpeedrunError as e:
            fail_planning(f"{CONFIG_FILES}: data.files.paths: {e}")
    return files


# Checked now, not only when a job needs them: Snakemake does not evaluate the input functions of jobs whose
# outputs exist, so paths matching nothing would otherwise leave earlier results standing.
if config["data"]["source"] == "files":
    get_document_files()


def get_folder_shards():
    """The shards of data.shards.path (data.source `shards`; relative to `clone` when given): validation first,
    then train in name order."""
    try:
        return [str(p) for p in list_shard_folder(shards_path(config))]
    except SpeedrunError as e:
        fail_planning(f"{CONFIG_FILES}: {e}")


if config["data"]["source"] == "shards":  # a bad folder is refused before anything runs
    get_folder_shards()


def get_document_file(wildcards):
    files = get_document_files()
    index = int(wildcards.part)
    if index >= len(files):
        fail_planning(f"token stream {wildcards.part}: data.source {config['data']['source']!r} has "
                      f"{len(files)} input files")
    return files[index]


def get_text_column(wildcards):
    return config["data"]["files"]["text_column"] if config["data"]["source"] == "files" else "text"


def get_tokenize_input(wildcards):
    """What the `tokenize` job reads: documents.parquet, the token streams or the pre-tokenized shards."""
    source = config["data"]["source"]
    if source == "fineweb-gpt2":
        return get_downloaded_files()
    if source == "shards":
        return get_folder_shards()
    if source in ("fineweb", "files"):
        count = len(get_document_files())
        return [f"results/tokens/{wildcards.dataset}/{part:05d}.bin" for part in range(count)]
    return [f"results/corpus/{wildcards.dataset}/documents.parquet"]


def get_tokenize_mode(wildcards):
    source = config["data"]["source"]
    return {"fineweb-gpt2": "--pretokenized", "shards": "--pretokenized", "fineweb": "--streams",
            "files": "--streams"}.get(
        source, "--documents"
    )


def get_tokenize_options(wildcards):
    """The `tokenize` job's options of its mode: --shard-tokens, except for pre-tokenized shards (taken as they are;
    the command refuses the option there), and with token streams the documents file of each stream, which the
    command's messages name instead of the temporary streams. One shell-quoted string."""
    mode = get_tokenize_mode(wildcards)
    options = [] if mode == "--pretokenized" else ["--shard-tokens", str(config["data"]["shard_tokens"])]
    if config["data"]["source"] == "shards":
        options += ["--in-place"]
    if mode == "--streams":
        options += ["--stream-sources", *get_document_files()]
    return " ".join(shlex.quote(option) for option in options)


# Encoding uses every core: Snakemake lowers a rule's threads to the cores it is given (--cores), and a
# fixed number keeps commands that plan without --cores (--report, --list-changes) working.
ALL_CORES = 256


def get_tokenize_threads(wildcards):
    """Encoding uses every core; cutting streams or linking shards is one pass on one core."""
    return ALL_CORES if get_tokenize_mode(wildcards) == "--documents" else 1


rule tokenize_file:
    output:
        temp("results/tokens/{dataset}/{part}.bin"),
    input:
        documents=get_document_file,
        code=code("speedrun.tokenize"),
    wildcard_constraints:
        part=r"\d{5}",
    params:
        text_column=get_text_column,
    threads: ALL_CORES
    log:
        "logs/tokenize/{dataset}/{part}.log",
    shell:
        "speedrun tokenize --documents {input.documents:q} --text-column {params.text_column:q} "
        "--threads {threads} --out-stream {output:q} > {log} 2>&1"


rule tokenize:
    output:
        directory("results/shards/{dataset}"),
    input:
        data=get_tokenize_input,
        code=code("speedrun.tokenize"),
    params:
        mode=get_tokenize_mode,
        options=get_tokenize_options,
        text_column=get_text_column,
    threads: get_tokenize_threads
    log:
        "logs/tokenize/{dataset}.log",
    shell:
        "speedrun tokenize {params.mode} {input.data:q} {params.options} --text-column {params.text_column:q} "
        "--dataset {wildcards.dataset} --threads {threads} --out-dir {output} > {log} 2>&1"
