"""The migration of one SGLang launch command, level 0 up: :func:`plan_migration`.

1. The command is read as ``cpkv flags --from-sglang`` reads it; one that SGLang or cpkv
   would refuse is refused first (:class:`Refusal`), with every problem.
2. Its baseline is the same server with cpkv's settings and SGLang's KV sharding taken out
   (seed-series names already translated to 0.5.23's): level 0.
3. Each step of :data:`~cpkv.migrate.steps.LADDER` adds its flags to the step before and is
   settled (:func:`~cpkv.migrate.settle.settle`): every problem the reader reports is
   answered from the fix table, and re-read, until none is left. What the step needed is
   what settling added; a problem no fix clears leaves the step, and those above it, unrun.
4. Each runnable step is planned (:func:`~cpkv.migrate.capacity.step_capacity`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from cpkv.migrate.capacity import DEFAULT_GPU_MEM_GIB, StepCapacity, step_capacity
from cpkv.migrate.launch import Changes, Edit, EditKind, LaunchCommand, changes
from cpkv.migrate.needs import Need
from cpkv.migrate.plugin import DEFAULT_SHADOW_RATE, PLUGIN_ENV
from cpkv.migrate.settle import Settled, settle
from cpkv.migrate.steps import LADDER, StepSpec
from flags import FLAG_SPECS, PHASE_FIELDS, Problem, SglangImport, check_flags, read_sglang
from flags.sglang.launcher import split_launch
from flags.sglang.seed import translate_seed
from phases import PhaseId


@dataclass(frozen=True, slots=True)
class MigrateOptions:
    """What a migration is planned for."""

    preset: str | None = None
    """A cpkv model preset whose rules apply instead of ``--model-path``'s (``--model``)."""
    gpu_mem_gib: float = DEFAULT_GPU_MEM_GIB
    """GPU memory per rank for the capacity figures."""
    shadow_rate: float | None = None
    """The plugin's shadow rate; None: the command's ``CPKV_SHADOW_RATE``, else 0.01."""
    plugin_config: str | None = None
    """A cpkv config file for the plugin (``CPKV_CONFIG``); None: none."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A command SGLang 0.5.23 or cpkv would not start: nothing is migrated."""

    command: str
    problems: tuple[Problem, ...]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the rollout, settled."""

    number: int
    spec: StepSpec
    settled: Settled | None
    """None when an earlier step cannot run."""
    changes: Changes = field(default_factory=Changes)
    """Against the step before (step 0: against the command given)."""
    capacity: StepCapacity | None = None
    capacity_error: str | None = None

    @property
    def runnable(self) -> bool:
        """True when the step's command starts."""
        return self.settled is not None and self.settled.runnable


@dataclass(frozen=True, slots=True)
class Migration:
    """Every step from level 0 to the highest one SGLang 0.5.23 runs."""

    command: str
    imported: SglangImport
    """The command given, as read."""
    given_levels: tuple[int, ...]
    """The levels the command given already runs."""
    options: MigrateOptions
    shadow_rate: float
    steps: tuple[Step, ...]
    notes: tuple[str, ...]
    """What the baseline took out of the command given, and why."""

    @property
    def last_runnable(self) -> Step:
        """The highest step that starts (step 0 always does)."""
        return [s for s in self.steps if s.runnable][-1]


def plan_migration(command: str, options: MigrateOptions) -> Migration | Refusal:
    """The rollout of ``command`` (see the module docstring).

    Raises:
        FlagError: the command is bad input (does not split, SGLang's parser refuses it).
    """
    imported = read_sglang(command, options.preset)
    problems = (*imported.problems, *check_flags(imported.flags))
    if problems:
        return Refusal(command, problems, imported.warnings)
    given = _given(command)
    baseline, notes = _baseline(given)
    rate = _shadow_rate(imported, options)
    steps: list[Step] = []
    previous = given
    for number, spec in enumerate(LADDER):
        if steps and not steps[-1].runnable:
            steps.append(Step(number, spec, None))
            continue
        start = baseline if not steps else previous
        target = start
        for edit in spec.adds(start, rate, options.plugin_config):
            target = target.apply(edit)
        settled = settle(target, options.preset)
        if steps:
            settled = _keep_cp_size(settled, steps[-1].settled, options.preset)
        steps.append(_planned(number, spec, settled, previous, options))
        previous = settled.command
    if not steps[0].runnable:
        raise RuntimeError(f"level 0 of {command!r} does not start: indicates a bug")
    return Migration(
        command, imported, _levels(imported), options, rate, tuple(steps), tuple(notes)
    )


def _given(command: str) -> LaunchCommand:
    """The command with 0.5.23's names, cpkv-only options as their ``CPKV_*`` variables."""
    launch = split_launch(command)
    env = dict(launch.env)
    translated = translate_seed(list(launch.argv))
    for name, (raw, _) in translated.extra.items():
        env[FLAG_SPECS[name].env] = "1" if raw is True else str(raw)
    return LaunchCommand.from_parts(env, translated.argv)


PHASE_ENV = (
    *(FLAG_SPECS[f].env for f in PHASE_FIELDS.values()),
    FLAG_SPECS["max_phase"].env,
)
"""cpkv's phase switches and ceiling as variables (``CPKV_ENABLE_NSA_PREFILL_CP_NARROW_OUTPUT``,
..., ``CPKV_MAX_PHASE``)."""


def _baseline(given: LaunchCommand) -> tuple[LaunchCommand, list[str]]:
    """``given`` without SGLang's KV sharding and cpkv's phase and plugin settings."""
    notes = []
    baseline = given.apply(Edit(EditKind.DROP, "enable_kv_cache_sharding"))
    if baseline != given:
        notes.append("level 0 drops --enable-kv-cache-sharding; step 2 adds it back")
    env = given.env_dict
    for name in dict.fromkeys((*PHASE_ENV, *PLUGIN_ENV)):
        if name in env:
            baseline = baseline.apply(Edit(EditKind.UNSET_ENV, name))
            notes.append(f"level 0 drops {name}={env[name]}: the steps set cpkv's phases")
    return baseline, notes


def _shadow_rate(imported: SglangImport, options: MigrateOptions) -> float:
    if options.shadow_rate is not None:
        return options.shadow_rate
    if imported.resolved.sources["shadow_rate"] != "default":
        return imported.flags.shadow_rate
    return DEFAULT_SHADOW_RATE


def _levels(imported: SglangImport) -> tuple[int, ...]:
    enabled = imported.flags.enabled_phases()
    levels = [1] if PhaseId.NARROW_OUTPUT in enabled else []
    return (*levels, 2, 3) if PhaseId.SHARDED_KV in enabled else tuple(levels)


def _planned(
    number: int,
    spec: StepSpec,
    settled: Settled,
    previous: LaunchCommand,
    options: MigrateOptions,
) -> Step:
    delta = changes(previous, settled.command)
    if not settled.runnable:
        return Step(number, spec, settled, delta)
    try:
        capacity = step_capacity(
            settled.command.text, options.preset, options.gpu_mem_gib, max(spec.levels) >= 2
        )
    except ValueError as exc:
        return Step(number, spec, settled, delta, None, str(exc))
    return Step(number, spec, settled, delta, capacity)


KEEP_CP_SIZE = "MIGRATE_KEEP_CP_SIZE"
"""The code of migrate's own rule: a step keeps the CP size the step before ran."""


def _keep_cp_size(settled: Settled, before: Settled | None, preset: str | None) -> Settled:
    """``settled`` with ``--attn-cp-size`` pinned to the CP size the step before ran, when
    no need asked to change it and SGLang would resolve another (zigzag resolves CP from TP;
    interleave keeps an explicit ``--attn-cp-size``)."""
    if before is None or not settled.runnable:
        return settled
    was, now = before.imported.sglang.cp_size, settled.imported.sglang.cp_size
    asked = any(n.edit.name in ("attn_cp_size", "enable_prefill_cp") for n in settled.needs)
    if was <= 1 or now == was or asked:
        return settled
    edit = Edit(EditKind.SET, "attn_cp_size", str(was))
    pinned = settle(settled.command.apply(edit), preset)
    rule = f"the step before ran CP {was}; this command alone would resolve CP {now}"
    need = Need(edit, (KEEP_CP_SIZE,), "attn_cp_size", now, rule, "cpkv migrate")
    return replace(pinned, needs=(*settled.needs, need, *pinned.needs))
