"""`snakemake -n` plans the same jobs with the same params, threads, resources and priorities as the reference
commit 336ddaa did, on the default config and on the FineWeb config with a two-node variant.

The fixtures tests/data/plan-*.json were recorded by tests/plan_snapshot.py on that commit, before the planning
code moved into the package (speedrun.workflow.planning); a change that means to plan differently re-records
them and says why. Re-recorded once since: the train rule's --config now carries only the settings that differ
from TrainConfig's defaults (a new switch, off by default, changes no run's params); every job, output and
resource is the same, and each --config builds the same TrainConfig and GPTConfig as the one recorded on 336ddaa.
And once more for issue 22: the train job first checks its shards (``<python> -m speedrun.data.integrity``), then
``exec``s the launcher (so that the launcher's parent is Snakemake) and appends to the log; nothing else changed.
plan-fineweb.json since follows configs/fineweb-8xh100.yaml (the record89 preset and its staged schedule, issue 20),
and was re-recorded when that config wrote the records' Adam ε as they do (adam_eps 1e-10, the default, with
adam_eps_units micro_batch_sum): the train jobs' --config lose "adam_eps":2.03e-15 and gain
"adam_eps_units":"micro_batch_sum", and gain "adam_kind_wd_mul":{"embed":5,"head":150,"scalar":0} (the records'
per-kind Adam weight decay); every job, output and resource is the same.
And once more (2026-12-03): the FineWeb fixture had recorded config.yaml's ``candidate`` override
``muon_lr: 0.04`` merged into configs/fineweb-8xh100.yaml's own ``candidate`` (a leak: that config sets no
muon_lr); a --configfile's ``variants`` now replace config.yaml's (planning.replace_default_variants), and the
candidate's ten train jobs carry the record's muon_lr 0.023; nothing else changed.
The launcher has since moved into the package (``python -m speedrun.workflow.launcher`` for
``workflow/scripts/launch_train.py``): tests/plan_snapshot.py records either as ``<launcher>``, so the fixtures
stand unchanged.
And for issue 21's script variants: the compare jobs name what each side runs (``--describe-baseline``,
``--describe-candidate``: our model's preset and the settings that differ from the baseline's) and the report job
every variant's (``--describe``) and the script variants (``--replicates``, none here); every other job, the train
jobs included, is unchanged.
And for Adam every other step (record #39, ``adam_every: 2`` in configs/fineweb-8xh100.yaml): the FineWeb train
jobs' --config gain "adam_every":2; nothing else changed.
And for Muon's q/k head-pair blocks (record #80, ``muon_qk_block_heads: 2`` in configs/fineweb-8xh100.yaml): the
FineWeb train jobs' --config gain "muon_qk_block_heads":2; nothing else changed.
And for the records' gradient units (``loss_units: micro_batch_sum``, their ``model(...).sum() * grad_scale``):
the FineWeb train jobs' --config gain "loss_units":"micro_batch_sum"; nothing else changed (checked by script:
each of the 22 changed lines equals its old self with that item added).
And for the records' bf16 weights (``weight_dtype: bfloat16``, record #57): the FineWeb train jobs' --config gain
"weight_dtype":"bfloat16"; nothing else changed (checked by script as above, 22 lines).
And for the report's lines in the terminal (2026-12-07): the report job's shell ends ``2>&1 | tee
logs/report/report.log`` instead of ``> logs/report/report.log 2>&1``; nothing else changed (one line a fixture).
And for script variants' seeds (2026-12-07): the parse jobs' shell gains ``--seed <the job's seed>`` (recorded
where a log names none, as a record script's does); nothing else changed (one substitution per parse job).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plan_snapshot import CASES, planned

pytestmark = pytest.mark.slow
DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("fixture", sorted(CASES))
def test_the_plan_is_the_reference_commits(fixture):
    expected = json.loads((DATA / fixture).read_text())
    got = planned(CASES[fixture]())
    assert [(j["rule"], j.get("output")) for j in got] == [(j["rule"], j.get("output")) for j in expected]
    for job, reference in zip(got, expected):
        assert job == reference, f"{job['rule']} {job.get('output')}"
