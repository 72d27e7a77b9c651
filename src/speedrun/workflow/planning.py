"""The experiment that config.yaml describes, resolved once for the Snakefile: :func:`resolve_experiment`.

Every variant's training settings are merged (the shared ``train`` section with the variant's overrides),
validated and resolved into one :class:`~speedrun.training.config.TrainConfig` each; its processes are placed
(:class:`Placement`: nodes, GPUs, Slurm resources) and the runs ordered (:attr:`Experiment.run_order`).
Everything that refuses a config here raises :class:`SpeedrunError` with one line naming the config files,
the key and the value; the Snakefile prints it and stops before anything runs. The config files themselves are
checked first (:func:`check_config_syntax`, :func:`schema_error_message`).

Can the shards feed a run before it is scheduled? The public BOS-aligned loader once ran out of data mid-run
(modded-nanogpt PR #120). The workflow calls :func:`check_training_data` for every variant
(:meth:`Experiment.check_data`) as soon as the BOS index exists, before any training job starts, and refuses a
run whose planned steps the train shards cannot feed, or whose validation tokens the validation shard does not
hold. The loader is simulated exactly (no token is copied), so documents cut at ``max_seq_len`` and the tails
dropped by BOS alignment are counted.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from speedrun.data.dataset import BOS_ENTRY_KEYS, SHARD_ENTRY_KEYS, check_splits, read_manifest
from speedrun.errors import SpeedrunError, did_you_mean, number_text_hint
from speedrun.workflow.messages import more_data_hint, schema_value_hint, value_span
from speedrun.model.config import PRESETS, GPTConfig
from speedrun.optim.schedules import batch_stages
from speedrun.optim.stages import StagedSchedule
from speedrun.training.config import ComputeDtype, ComputeSettings, DeviceChoice, TrainConfig, resolve_dtype
from speedrun.training.data import cut_documents_hint, steps_fed
from speedrun.workflow.script_variants import (SCRIPT_TRAIN_KEYS, ScriptSpec, check_script_train_keys, config_path,
                                               script_spec)

# Where a refused training setting is written when no variant overrides it.
SHARED_TRAIN = "the shared `train` section (every variant)"
# results/stats/compare/ holds the comparisons: a variant of that name would share its folder with them.
RESERVED_VARIANTS = ("compare",)
# The settings check_training_data reads: variants that share them (they usually differ in optimizer or model
# settings only) share one simulation of the loader, about a second at FineWeb scale (3,200 steps, 2.4B tokens).
DATA_SHAPE_KEYS = ("steps", "tokens_per_step", "micro_batches", "max_seq_len", "val_tokens", "batch_schedule",
                   "staged_schedule", "train_batches")


@dataclass(frozen=True)
class Placement:
    """Where one run's ``world_size`` processes go (config.yaml ``train.world_size``, ``train.nodes``,
    ``train.device``), and what a scheduler must give it (README "Running on GPUs and clusters").

    ``gpus``: the GPUs a one-node CUDA run holds (the ``gpu`` resource Snakemake counts, sbatch --gpus); 0 for
    a CPU run and for a multi-node run, which asks per node instead (``gres``, sbatch --gres=gpu:N).
    ``mpi``: ``srun`` for a multi-node run (the Slurm job step runs the rule's command itself and the launcher
    starts one torchrun per node); ``tasks``: one Slurm task per node of it; ``tasks_per_gpu``: 0 for a
    multi-node GPU run, so that the Slurm executor does not turn ``tasks`` into --ntasks-per-gpu
    (snakemake-executor-plugin-slurm issue #316). None: no such resource."""

    world_size: int
    device: str
    nodes: int = 1

    @property
    def procs_per_node(self) -> int:
        """Processes on each node; also the cores a node's job asks for (one per process)."""
        return self.world_size // self.nodes

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    @property
    def gpu_run(self) -> bool:
        return self.device == "cuda"

    @property
    def gpus(self) -> int:
        return self.world_size if self.gpu_run and not self.multi_node else 0

    @property
    def gres(self) -> str | None:
        return f"gpu:{self.procs_per_node}" if self.gpu_run and self.multi_node else None

    @property
    def mpi(self) -> str | None:
        return "srun" if self.multi_node else None

    @property
    def tasks(self) -> int | None:
        return self.nodes if self.multi_node else None

    @property
    def tasks_per_gpu(self) -> int | None:
        return 0 if self.gres else None


@dataclass(frozen=True)
class Variant:
    """One variant of the experiment: its ``seeds`` (config order), its training settings as written
    (``settings``: ``train`` merged with the variant's overrides, ``nodes`` included), resolved once
    (``train``: the :class:`TrainConfig` ``speedrun train`` builds from ``params``, its dtype resolved for a
    ``cpu`` or ``cuda`` device), ``params`` (the canonical JSON the train rule passes, :func:`train_params`)
    its ``placement`` and ``overrides``, the training keys the variant itself sets (messages name the shared
    ``train`` section for a value the variant does not set).

    A script variant (``script``, :class:`~speedrun.workflow.script_variants.ScriptSpec`) has no ``train``
    (None): its script sets its own model and schedule; ``settings`` holds only the keys that place it
    (world_size, nodes, device) and ``params`` is its spec's JSON."""

    name: str
    seeds: tuple[int, ...]
    settings: Mapping[str, Any]
    train: TrainConfig | None
    params: str
    placement: Placement
    script: ScriptSpec | None = None
    overrides: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Experiment:
    """The experiment of one config (:func:`resolve_experiment`): ``variants`` by name in config order,
    ``baseline`` and the ``candidates`` (the other variants, in config order), the ``dataset`` name,
    ``corpus_fixed`` (the embedded corpus, which cannot grow) and ``where`` (the config files, for messages)."""

    where: str
    dataset: str
    corpus_fixed: bool
    variants: Mapping[str, Variant]
    baseline: str
    _data_checked: set = field(default_factory=set, compare=False, repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.variants)

    @property
    def candidates(self) -> tuple[str, ...]:
        return tuple(v for v in self.variants if v != self.baseline)

    def variant(self, name: str) -> Variant:
        """The variant ``name``; raises :class:`SpeedrunError` naming the variants for another name."""
        if name not in self.variants:
            raise SpeedrunError(f"unknown variant {name!r}: {self.where} `variants` has {', '.join(self.names)}")
        return self.variants[name]

    def seeds(self, name: str) -> tuple[int, ...]:
        return self.variant(name).seeds

    def describe(self, name: str) -> str:
        """What variant ``name`` runs, one line for the comparison and the report: a script variant's script,
        path and sha256 (:meth:`~speedrun.workflow.script_variants.ScriptSpec.describe`); for our model
        ``our model, preset <p>`` and, against a baseline of our model, the settings that differ from the
        baseline's (``muon_lr=0.04``, a model setting as ``model.<key>``)."""
        variant = self.variant(name)
        if variant.script is not None:
            return variant.script.describe()
        text = f"our model, preset {variant.train.preset}"
        base = self.variants[self.baseline].train
        if name == self.baseline or base is None:
            return text
        base_settings = _flat_settings(base)
        differs = [f"{k}={v}" for k, v in _flat_settings(variant.train).items() if base_settings.get(k) != v]
        return text + (f"; differs from the baseline in {', '.join(differs)}" if differs else "")

    @property
    def script_variants(self) -> tuple[str, ...]:
        """The variants that run a script of their own (``variants.<name>.script``), config order."""
        return tuple(v.name for v in self.variants.values() if v.script is not None)

    @property
    def model_variants(self) -> tuple[str, ...]:
        """The variants that train our model (``speedrun train``), config order."""
        return tuple(v.name for v in self.variants.values() if v.script is None)

    @property
    def runs(self) -> list[tuple[str, int]]:
        """Every (variant, seed), in config order."""
        return [(v.name, s) for v in self.variants.values() for s in v.seeds]

    @property
    def run_order(self) -> list[tuple[str, int]]:
        """Every (variant, seed) in the order the runs should start: the first seed of each variant (the
        baseline first), then the second seed of each, and so on. Alternating the variants makes a drift of the
        machines over time (heat, other jobs, a slower node) fall on both sides of a comparison alike."""
        order = [self.variants[v].seeds for v in (self.baseline, *self.candidates)]
        names = (self.baseline, *self.candidates)
        return [(name, seeds[i]) for i in range(max(map(len, order))) for name, seeds in zip(names, order)
                if i < len(seeds)]

    def priority(self, variant: str, seed: int) -> int:
        """Scheduling priority of a run (higher starts first): len(runs) for the first run of
        :attr:`run_order`, down to 1 for the last."""
        order = self.run_order
        return len(order) - order.index((variant, seed))

    def check_seed(self, variant: str, seed: int) -> None:
        """Refuse a run of a seed the variant does not list (a target named on the command line)."""
        if seed not in self.seeds(variant):
            raise SpeedrunError(f"seed {seed} is not a seed of variant {variant!r} in {self.where} "
                                f"(its seeds: {list(self.seeds(variant))})")

    def check_data(self, variant: str, shards_dir: str | Path, bos_dir: str | Path) -> None:
        """Refuse, at planning time, a variant whose batches the train or validation shards cannot feed
        (:func:`check_training_data`); variants of the same data shape (:data:`DATA_SHAPE_KEYS`) are checked
        once. The message names the variant when it sets one of those keys itself, else the shared ``train``
        section. A script variant is not checked: its script reads the shards itself."""
        if self.variant(variant).train is None:
            return
        settings = json.loads(json.dumps(self.variant(variant).train.settings()))     # every setting, JSON values
        key = (json.dumps([settings[k] for k in DATA_SHAPE_KEYS]), str(shards_dir), str(bos_dir))
        if key not in self._data_checked:
            own = set(DATA_SHAPE_KEYS) & self.variant(variant).overrides
            check_training_data(settings, shards_dir, bos_dir,
                                what=f"{self.where}: {f'variant {variant!r}' if own else SHARED_TRAIN}",
                                corpus_fixed=self.corpus_fixed)
            self._data_checked.add(key)


def _flat_settings(train: TrainConfig) -> dict[str, str]:
    """Every setting of ``train`` as ``key -> JSON value``, the model's as ``model.<key>``, in declaration order."""
    settings = json.loads(json.dumps(train.settings()))
    model = settings.pop("model")
    flat = {k: json.dumps(v, sort_keys=True) for k, v in settings.items()}
    flat.update({f"model.{k}": json.dumps(v, sort_keys=True) for k, v in model.items()})
    return flat


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated with ``overrides``, recursively for nested mappings (a variant's ``model`` overrides)."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def resolve_experiment(config: Mapping[str, Any], where: str = "config.yaml") -> Experiment:
    """The experiment of ``config`` (config.yaml after the schema's check and defaults), every variant's
    settings merged, validated and resolved once. ``where`` names the config files in messages (e.g.
    ``config.yaml + --config``).

    Raises:
        SpeedrunError: one line naming ``where`` and the key: ``stats.baseline`` not a variant; a variant named
            ``compare``; a seed that is not an integer; an unknown or misspelt training or model setting (named
            where it is written, ``train.<key>``, ``variants.<variant>.train.<key>`` or ``...train.model.<key>``,
            with the closest valid names); a setting ``speedrun train``
            would refuse (naming the variant, or the shared ``train`` section when every variant fails the same
            way there); a ``train.world_size`` that does not split over ``train.nodes``; two variants with the
            same resolved settings; for a script variant (:mod:`speedrun.workflow.script_variants`): a bad
            ``script`` mapping or a missing file, a key of its ``train`` that does not apply to a script, more
            than one node.
    """
    variants, baseline = config["variants"], config["stats"]["baseline"]
    names = list(variants)
    if baseline not in variants:
        raise SpeedrunError(f"{where}: stats.baseline is {baseline!r}, which is not a variant; expected one of the "
                            f"keys of `variants`: {', '.join(names)}")
    for name in RESERVED_VARIANTS:
        if name in variants:
            raise SpeedrunError(f"{where}: variants.{name}: {name!r} is reserved (results/stats/{name}/ holds the "
                                "comparisons); choose another variant name")
    for name in names:              # YAML reads 1.0 as a float, which the schema's integer type accepts
        for seed in variants[name]["seeds"]:
            if not isinstance(seed, int) or isinstance(seed, bool):
                raise SpeedrunError(f"{where}: variants.{name}.seeds: {seed!r} is not an integer; write "
                                    f"{int(seed) if float(seed).is_integer() else 'a whole number'}")
    shared = config["train"]
    _check_known_keys(where, [("train", shared)] + [(f"variants.{v}.train", variants[v].get("train") or {})
                                                    for v in names])
    resolved = {}
    for name in names:
        overrides = variants[name].get("train") or {}
        settings = merge(shared, overrides)
        if "script" in variants[name]:
            resolved[name] = _script_variant(where, name, variants[name], settings, config.get("clone"))
            continue
        try:
            train = _train_config(settings)
        except SpeedrunError as e:
            raise SpeedrunError(f"{where}: {_where_refused(e, shared, name)}: {e}") from None
        placement = _placement(where, settings, train.world_size, train.compute.device,
                               f"variant {name!r}" if {"nodes", "world_size"} & overrides.keys() else SHARED_TRAIN)
        resolved[name] = Variant(name=name, seeds=tuple(variants[name]["seeds"]), settings=settings, train=train,
                                 params=train_params(train), placement=placement, overrides=frozenset(overrides))
    _check_distinct(where, resolved, baseline, variants)
    return Experiment(where=where, dataset=config["data"]["name"], variants=resolved, baseline=baseline,
                      corpus_fixed=config["data"]["source"] == "embedded")


def _script_variant(where: str, name: str, variant: Mapping[str, Any], settings: Mapping[str, Any],
                    clone: str | None) -> Variant:
    """A script variant (:mod:`speedrun.workflow.script_variants`): its script resolved and its processes placed
    from the train settings that apply (``settings``: the shared ``train`` with the variant's overrides); its
    own ``train`` may hold only those keys. One node: ``speedrun run-script`` starts ``torchrun --standalone``."""
    overrides = variant.get("train") or {}
    check_script_train_keys(where, name, overrides)
    spec = script_spec(where, name, variant["script"], clone)
    placing = {k: v for k, v in settings.items() if k in SCRIPT_TRAIN_KEYS}
    written = f"variant {name!r}" if placing.keys() & overrides.keys() else SHARED_TRAIN
    world_size = placing.get("world_size", TrainConfig.world_size)
    device = placing.get("device", ComputeSettings.device)
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise SpeedrunError(f"{where}: {written}: train.world_size must be an integer >= 1, got {world_size!r}"
                            f"{number_text_hint(world_size)}")
    if device not in DeviceChoice.__args__:
        raise SpeedrunError(f"{where}: {written}: train.device must be one of {', '.join(DeviceChoice.__args__)}; "
                            f"got {device!r}")
    placement = _placement(where, placing, world_size, device, written)
    if placement.multi_node:
        raise SpeedrunError(f"{where}: {written}: train.nodes is {placement.nodes}, but script variant {name!r} "
                            "runs on one node (speedrun run-script starts torchrun --standalone); set train.nodes "
                            "to 1 for it")
    return Variant(name=name, seeds=tuple(variant["seeds"]), settings=placing, train=None, params=spec.params,
                   placement=placement, script=spec)


def shards_path(config: Mapping[str, Any]) -> str:
    """``data.shards.path`` as the workflow reads it: relative to the config's ``clone`` folder when it names
    one (:func:`~speedrun.workflow.script_variants.config_path`). Raises :class:`SpeedrunError` when the key
    is missing."""
    if "path" not in config["data"]["shards"]:
        raise SpeedrunError("data.source 'shards' needs data.shards.path, the folder of the shards")
    return config_path(config["data"]["shards"]["path"], config.get("clone"))


def _check_known_keys(where: str, sections: list[tuple[str, Mapping[str, Any]]]) -> None:
    """Refuse a key of a ``train`` section (``train``, ``variants.<v>.train``) that is no training setting, or
    a key of its ``model`` mapping that is no :class:`~speedrun.model.config.GPTConfig` field, named where it is
    written, with the closest names (a typo) and the valid ones."""
    known = sorted([*TrainConfig.setting_names(), "nodes"])
    model_known = [f.name for f in dataclasses.fields(GPTConfig)]
    for section, settings in sections:
        for key in settings:
            if key not in known:
                raise SpeedrunError(f"{where}: {section}.{key}: unknown training setting{did_you_mean(key, known)}; "
                                    f"expected one of {', '.join(known)}")
        model = settings.get("model")
        for key in model if isinstance(model, Mapping) else ():
            if key not in model_known:
                raise SpeedrunError(f"{where}: {section}.model.{key}: unknown model setting"
                                    f"{did_you_mean(key, model_known)}; expected a field of GPTConfig "
                                    f"(speedrun.model.config): {', '.join(model_known)}")


def _where_refused(error: SpeedrunError, shared: Mapping[str, Any], variant: str) -> str:
    """The shared ``train`` section when it alone is refused with the same message, else the variant."""
    try:
        TrainConfig.from_dict({k: v for k, v in shared.items() if k != "nodes"})
    except SpeedrunError as e:
        if str(e) == str(error):
            return SHARED_TRAIN
    return f"variant {variant!r}"


def _train_config(settings: Mapping[str, Any]) -> TrainConfig:
    """The one :class:`TrainConfig` of ``settings`` (without ``nodes``, which places the processes but does not
    change what they compute), its ``dtype: auto`` resolved for a ``cpu`` or ``cuda`` device, as ``speedrun
    train`` resolves it (:meth:`TrainConfig.resolved_for`) and its log's ``config:`` header shows it."""
    values = {k: v for k, v in settings.items() if k != "nodes"}
    device = values.get("device", ComputeSettings.device)
    dtype = values.get("dtype", ComputeSettings.dtype)
    if device in ("cpu", "cuda") and isinstance(dtype, str) and dtype in ComputeDtype.__args__:
        values["dtype"] = resolve_dtype(dtype, device)
    return TrainConfig.from_dict(values)


def train_settings(train: TrainConfig) -> dict[str, Any]:
    """The training settings of ``train`` that differ from :class:`TrainConfig`'s defaults, as JSON values (the
    ``train`` keys of config.yaml), with ``model`` holding only the overrides whose value differs from the
    preset's (``n_layer: 4`` on the tiny preset changes nothing); ``preset`` and ``model`` always stay, and so
    does ``rotary_positions`` when given: written out, it stops the rotary tables being sized to the schedule
    (:meth:`TrainConfig.model_config`). ``speedrun train`` rebuilds the same config from it (the missing keys take
    the same defaults), and a setting added to the code with a default (a new switch, off) changes no run's
    params."""
    settings = json.loads(json.dumps(train.settings()))
    defaults = _default_settings()
    kept = {k: v for k, v in settings.items() if k in ("preset", "model") or defaults.get(k, object()) != v}
    preset = json.loads(json.dumps(dataclasses.asdict(PRESETS[train.preset])))
    kept["model"] = {k: v for k, v in settings["model"].items()
                     if k == "rotary_positions" or preset.get(k, object()) != v}
    return kept


@functools.cache
def _default_settings() -> dict[str, Any]:
    """:class:`TrainConfig`'s default settings as JSON values (built once)."""
    return json.loads(json.dumps(TrainConfig().settings()))


def train_params(train: TrainConfig) -> str:
    """The settings ``speedrun train`` gets, as canonical JSON (a params value Snakemake compares as a string):
    :func:`train_settings`, so that a default written out (``dtype: auto``, ``muon_lr: 0.05``) gives the same
    params and reruns nothing."""
    return json.dumps(train_settings(train), sort_keys=True, separators=(",", ":"))


def _placement(where: str, settings: Mapping[str, Any], world_size: int, device: str, written: str) -> Placement:
    """The placement of ``world_size`` processes on ``device``; refuse a ``train.nodes`` (of ``settings``) that is
    not an integer >= 1 or does not divide ``world_size`` (``written``: where the refused values are, a variant or
    the shared section)."""
    nodes = settings.get("nodes", Placement.nodes)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        raise SpeedrunError(f"{where}: {written}: train.nodes must be an integer >= 1, got "
                            f"{nodes!r}{number_text_hint(nodes)}")
    if world_size % nodes:
        raise SpeedrunError(f"{where}: {written}: train.world_size {world_size} is not a multiple of "
                            f"train.nodes {nodes}; expected world_size = nodes x processes per node (every node "
                            "runs the same number)")
    return Placement(world_size=world_size, nodes=nodes, device=device)


def _check_distinct(where: str, resolved: Mapping[str, Variant], baseline: str,
                    variants: Mapping[str, Any]) -> None:
    """Refuse two variants whose resolved settings are the same: their runs would be the same runs under two
    names, and the comparison would measure nothing."""
    seen: dict[str, str] = {}
    for name in [baseline] + [v for v in resolved if v != baseline]:
        params = resolved[name].params
        if params in seen:
            other = seen[params]
            overrides = json.dumps(variants[name].get("train") or {}, sort_keys=True)
            must = ("a candidate must differ from the baseline" if other == baseline
                    else "each variant must differ from the others")
            if resolved[name].script is not None:
                raise SpeedrunError(f"{where}: variants {name} and {other} run the same script with the same env "
                                    f"({resolved[name].script.describe()}); {must}")
            raise SpeedrunError(f"{where}: variants {name} and {other} resolve to the same train settings: "
                                f"variants.{name}.train {overrides} changes nothing (each value is that of `train` "
                                f"or TrainConfig's default); {must}")
        seen[params] = name


def schema_error_message(config_files: str, error: BaseException) -> str:
    """One line for a config that fails workflow/schemas/config.schema.yaml: the config files, the dotted
    key, jsonschema's message and, for a number YAML read as text, how to write it (e.g. ``config.yaml:
    stats.target: '4.6e0' is not of type 'number' (text, not a number: ...)``). ``error``: the
    ``jsonschema.ValidationError``, or snakemake's ``WorkflowError`` that carries it (snakemake.utils.
    validate, which raises it while handling the ValidationError, so the latter is its ``__context__``); any
    other error gives its own text after the files."""
    chain = (error, error.__cause__, error.__context__, *getattr(error, "args", ()))
    found = next((a for a in chain if hasattr(a, "absolute_path")), None)
    if found is None:
        return f"{config_files}: {error}"
    key = ".".join(str(part) for part in found.absolute_path) or "(the top level)"
    return f"{config_files}: {key}: {found.message}{schema_value_hint(config_files, key, found.instance)}" \
           f"{_unexpected_key_hint(found)}{_pattern_hint(found)}"


def _pattern_hint(found: Any) -> str:
    """For a value that fails a schema's ``pattern``: that schema's description in parentheses (for a name,
    the schema's ``$defs/name``: the rule in words), else ``""``."""
    description = found.schema.get("description") if isinstance(found.schema, Mapping) else None
    return f" ({description.strip()})" if found.validator == "pattern" and description else ""


def _unexpected_key_hint(found: Any) -> str:
    """For a key the schema does not allow (jsonschema's ``additionalProperties``): the closest allowed key and
    the allowed ones (`` (did you mean 'stats'?); expected one of data, train, ...``), else ``""``."""
    allowed = list((found.schema or {}).get("properties") or {})
    if found.validator != "additionalProperties" or not isinstance(found.instance, Mapping) or not allowed:
        return ""
    extra = [k for k in found.instance if k not in allowed]
    close = did_you_mean(str(extra[0]), allowed) if extra else ""
    return f"{close}; expected one of {', '.join(allowed)}"


def _unique_keys_loader() -> type:
    """A YAML SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently: a
    variant renamed to the name of another replaced it)."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} given twice in one mapping (first at line {seen[key] + 1}); the "
                        "second would replace the first", key_node.start_mark)
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeys


def check_config_syntax(path: str | Path) -> None:
    """Raise :class:`SpeedrunError` naming ``path``, line and column if the YAML file at ``path`` does not
    parse or gives a key twice in one mapping. Snakemake's own message ("Config file is not valid JSON or
    YAML") names neither the file nor the line, and it keeps the last of two equal keys silently; the
    Snakefile calls this for its config.yaml before Snakemake reads it. A missing file passes (Snakemake
    reports it)."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as e:
        raise SpeedrunError(f"{path}: cannot read the config file ({e})") from None
    try:
        yaml.load(text, Loader=_unique_keys_loader())
    except yaml.MarkedYAMLError as e:
        at = e.problem_mark or e.context_mark
        where = f"line {at.line + 1}, column {at.column + 1}: " if at else ""
        context = e.context or ""
        if e.context_mark and e.problem_mark and e.context_mark.line != e.problem_mark.line:
            context += f" (line {e.context_mark.line + 1}, column {e.context_mark.column + 1})"
        what = "; ".join(p for p in (context, e.problem) if p)
        tabs = " (YAML indents with spaces, not tabs)" if "character '\\t'" in str(e) else ""
        raise SpeedrunError(f"{path}: not valid YAML: {where}{what}{tabs}") from None
    except yaml.YAMLError as e:
        raise SpeedrunError(f"{path}: not valid YAML: {e}") from None


def check_dataset_named(config: Mapping[str, Any], project_config: str | Path, where: str) -> None:
    """Refuse a data source given on top of the project's config.yaml (``project_config``) without a data set
    name of its own: ``data.name`` names the shards and every result folder (``results/shards/<name>``, the runs
    under it), so a ``--configfile`` that sets ``data.source: shards`` alone would build those shards, and train
    on them, under config.yaml's ``shakespeare``, beside (and in place of) the embedded corpus's. Raises
    :class:`SpeedrunError` naming ``where`` (the config files), the two keys and what to write. A config.yaml
    that cannot be read leaves nothing to compare with (Snakemake reports it)."""
    import yaml

    try:
        own = (yaml.safe_load(Path(project_config).read_text(encoding="utf-8")) or {}).get("data") or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError):
        return
    data = config["data"]
    if own.get("name") == data["name"] and own.get("source") not in (None, data["source"]):
        raise SpeedrunError(f"{where}: data.source is {data['source']!r} but data.name is still config.yaml's "
                            f"{data['name']!r} (its {own['source']!r} data set's): give this data set a name of its "
                            f"own (data.name, e.g. data: {{source: {data['source']}, name: mydata}}), so that its "
                            f"shards and runs do not land under results/*/{data['name']}")


def replace_default_variants(config: dict[str, Any], configfiles: list[str | Path],
                             command_line: Mapping[str, Any]) -> bool:
    """Let the variants of a ``--configfile`` replace config.yaml's instead of merging into them.

    Snakemake merges every config file into config.yaml key by key, so without this a config that names its
    own ``baseline`` would still run config.yaml's ``candidate`` (3 seeds at ``muon_lr: 0.04``), and a variant
    of the same name would keep config.yaml's training overrides beside its own. An experiment file that gives
    ``variants`` gives all of them: when any of ``configfiles`` (the ``--configfile`` paths, Snakemake's
    ``workflow.config_settings.configfiles``) has a top-level ``variants`` key, ``config["variants"]`` becomes
    ``command_line["variants"]`` (Snakemake's ``overwrite_config``: those files merged in order, then the
    ``--config`` values). Without such a file nothing changes, so ``--config 'variants={...}'`` still edits
    config.yaml's variants. Returns whether the variants were replaced. A file that cannot be read or parsed
    is left to Snakemake, which has read it already."""
    import yaml

    def names_variants(path: str | Path) -> bool:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return False
        return isinstance(loaded, Mapping) and "variants" in loaded

    if not any(names_variants(path) for path in configfiles) or "variants" not in command_line:
        return False
    config["variants"] = json.loads(json.dumps(command_line["variants"]))
    return True


def match_document_files(patterns: list[str], where: str) -> list[str]:
    """The files of ``data.files.paths`` (data.source ``files``): each glob pattern's matches sorted (``**``
    recursive), pattern by pattern, a file matched twice kept at its first place. Relative patterns are read
    from the current folder (Snakemake's working folder).

    Raises :class:`SpeedrunError` naming ``where`` (the config files) for an empty list, and for a pattern that
    matches no file: a misspelt path among others would otherwise be left out of the dataset silently."""
    import glob
    import os

    if not patterns:
        raise SpeedrunError(f"{where}: data.files.paths is empty; data.source 'files' needs glob patterns of "
                            "documents files (.parquet, .jsonl/.ndjson, .txt)")
    files: list[str] = []
    for pattern in patterns:
        matched = sorted(glob.glob(os.path.expanduser(pattern), recursive=True))
        if not matched:
            relative = "" if os.path.isabs(os.path.expanduser(pattern)) else f" (read from {os.getcwd()})"
            raise SpeedrunError(f"{where}: data.files.paths: {pattern!r} matches no file{relative}; expected a "
                                "path or glob pattern of existing documents files")
        files.extend(f for f in matched if f not in files)
    return files


def _setting(cfg: Mapping[str, Any], key: str, what: str) -> int:
    if key not in cfg:
        raise SpeedrunError(f"{what}: training setting `{key}` is missing (expected an integer)")
    value = cfg[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpeedrunError(f"{what}: training setting `{key}` is {value!r}; expected a positive integer")
    return value


def check_training_data(cfg: Mapping[str, Any], shards_dir: str | Path, bos_dir: str | Path, what: str,
                        corpus_fixed: bool = False) -> None:
    """Raise :class:`SpeedrunError` unless the shards can feed the run that ``cfg`` describes.

    Args:
        cfg: resolved training settings (config.yaml ``train`` with a variant's overrides); reads ``steps``,
            ``tokens_per_step``, ``micro_batches``, ``max_seq_len``, ``val_tokens`` and the optional
            ``batch_schedule`` (``[tokens_per_step, max_seq_len]`` per equal stage of the steps) or
            ``staged_schedule`` (its ``to_dict`` form, whose stages it then takes), and ``train_batches``
            (the loader whose plan is counted; absent: ``bos_aligned``).
        shards_dir: the tokenize stage's folder (shards and ``manifest.json``).
        bos_dir: the bos_index stage's folder (one ``.npy`` per shard and ``manifest.json``).
        what: names the run in messages (e.g. ``"variant 'baseline'"``).
        corpus_fixed: the corpus cannot grow (the embedded one): a shortage then advises fewer steps or
            tokens per step, or a larger dataset, instead of more train shards.

    Raises:
        SpeedrunError: the batch does not divide into micro-batches; a manifest is missing, not JSON or has a
            shard entry without a key (the file, entry and key are named: :func:`~speedrun.data.dataset.
            read_manifest`, the keys of :data:`~speedrun.data.dataset.SHARD_ENTRY_KEYS` and
            :data:`~speedrun.data.dataset.BOS_ENTRY_KEYS`); the shards are not a validation shard then train
            shards (:func:`~speedrun.data.dataset.check_splits`); the validation shard holds fewer than
            ``val_tokens + 1`` tokens, or the train shards feed fewer than ``steps`` steps (the message says
            how many steps they feed and about how many shards the run needs).
    """
    shards_dir, bos_dir = Path(shards_dir), Path(bos_dir)
    steps = _setting(cfg, "steps", what)
    tokens_per_step = _setting(cfg, "tokens_per_step", what)
    micro_batches = _setting(cfg, "micro_batches", what)
    max_seq_len = _setting(cfg, "max_seq_len", what)
    val_tokens = _setting(cfg, "val_tokens", what)
    stages = batch_stages(steps, [tuple(pair) for pair in cfg.get("batch_schedule") or ()], tokens_per_step,
                          max_seq_len)
    if cfg.get("staged_schedule"):                      # its to_dict form (TrainConfig.settings): its own stages
        stages = StagedSchedule.from_dict(cfg["staged_schedule"]).batch_stages()
    for _, tokens, _ in stages:
        if tokens % micro_batches:
            raise SpeedrunError(
                f"{what}: tokens_per_step {tokens} is not a multiple of micro_batches {micro_batches}"
            )
    shards = read_manifest(shards_dir, "shards", SHARD_ENTRY_KEYS, stage="tokenize")["shards"]
    check_splits(shards_dir, shards)
    val, train = shards[0], shards[1:]
    if val["tokens"] < val_tokens + 1:
        raise SpeedrunError(
            f"{what}: val_tokens is {val_tokens} but the validation shard of {shards_dir} holds {val['tokens']} "
            f"tokens (it needs val_tokens + 1 = {val_tokens + 1}: the targets are the inputs shifted by one); "
            f"lower train.val_tokens to at most {val['tokens'] - 1}, or use a larger validation shard"
        )
    bos = {entry["shard"]: bos_dir / entry["file"]
           for entry in read_manifest(bos_dir, "shards", BOS_ENTRY_KEYS, stage="bos_index")["shards"]}
    missing = [s["file"] for s in train if s["file"] not in bos]
    if missing:
        raise SpeedrunError(f"{bos_dir}/manifest.json: no BOS index for shards {missing}")
    lengths = [s["tokens"] for s in train]
    starts = [np.load(bos[s["file"]], mmap_mode="r") for s in train]
    kind = cfg.get("train_batches") or "bos_aligned"
    fed = steps_fed(steps, micro_batches, stages, lengths, starts, kind)
    if fed < steps:
        tokens = sum(lengths)
        contiguous = kind == "contiguous"                # no document cut: more shards always help
        more = ("use a larger dataset (data.source: fineweb); this corpus cannot grow" if corpus_fixed
                else more_data_hint(len(train), steps, fed, tokens, stages,
                                    None if contiguous else sum(len(b) for b in starts)))
        how = ("contiguous batches" if contiguous
               else f"documents cut at max_seq_len {value_span(seq_len for _, _, seq_len in stages)}")
        raise SpeedrunError(
            f"{what}: {steps} steps of {value_span(per_step for _, per_step, _ in stages)} tokens ({how}) "
            f"need more data than the {len(train)} train shards of {shards_dir} hold ({tokens} tokens): they feed "
            f"only {fed} steps. Lower train.steps or train.tokens_per_step, or {more}."
            + ("" if contiguous else cut_documents_hint(fed, tokens_per_step, tokens, max_seq_len))
        )
