"""Run one shard to completion, exactly once per row, however often the worker is killed.

Order of a run (``run_shard``):

1. a complete marker of this run's config and model exists -> exit 0 at once, writing nothing, before
   torch or vLLM is imported (``complete_before_load``);
2. read the manifest, build the engine, hash the model files -> result fingerprint; a marker with this
   fingerprint exists -> exit 0, writing nothing; a marker with another fingerprint is stale -> deleted
   (the shard is re-done);
3. write ``attempts/<attempt_id>.json``; install SIGTERM/SIGINT handlers; load the model;
4. rebuild the resume ledger from committed files (stray temp files cleaned);
5. producer thread: read -> validate -> chunk -> tokenize; main thread: engine -> commit dead letters and
   one zstd part per chunk (create-only) -> rewrite the attempt record;
6. when every row is committed: verify coverage (results + dead letters = shard rows), rewrite the
   attempt record, write ``_SUCCESS.json`` LAST.

On a signal: stop taking batches, commit the finished rows, no marker, exit 75 (see ``signals``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
from batch_contract import resultcache, storage
from batch_contract.claims import ClaimBook, Lease, claim_units, unit_segments
from batch_contract.engine_config import ConfigError
from batch_contract.enums import ExitCode, ShardStatus
from batch_contract.hostinfo import host_facts
from batch_contract.layout import DEAD_LETTER_PREFIX, PART_PREFIX, RunLayout, is_reused_part, join_uri
from batch_contract.manifest import Manifest, result_fingerprint
from batch_contract.marker import AttemptRecord, ShardMarker
from batch_contract.partfiles import digest_of, quarantined_count
from batch_contract.runstore import RunStore, is_complete
from batch_contract.tokens import TokenCounts

from batch_worker.dedupe import Deduper
from batch_worker.engines.base import (
    ChunkOutput,
    ChunkRows,
    Engine,
    LoadedModel,
    check_chunk_output,
    engine_class,
)
from batch_worker.errors import BadInputError
from batch_worker.ledger import Ledger, build_ledger, read_parquet_columns
from batch_worker.pipeline import PRODUCER_JOIN_SECONDS, ChunkSizer, ChunkWork, Producer
from batch_worker.preprocess import DocumentPool
from batch_worker.progress import Counters, ProgressReporter, utc_now
from batch_worker.reader import iter_shard_blocks
from batch_worker.reuse import ReuseOutcome, reuse_enabled, reuse_pass
from batch_worker.signals import StopSignal
from batch_worker.stats import GpuSampler, StageClock, apply_thread_cap, cpu_seconds, release_memory
from batch_worker.stealing import (
    LeaseKeeper,
    claim_adjacent,
    pick_victim,
    steal_stop_reason,
    unfinished_shards,
)
from batch_worker.validate import DeadLetter, Validator
from batch_worker.writer import assemble_part, commit_table, dead_letter_table

log = logging.getLogger("batch_worker")


STEAL_TEMP_MIN_AGE_SECONDS = 600.0
"""With ``worker.steal``, a temp file is a killed writer's stray only once it is this old (seconds): a
commit (temp write, fsync, link) takes well under a second, and strays are ignored by every reader."""


class CoverageError(RuntimeError):
    """Committed results + dead letters do not cover the shard's rows exactly (no marker is written)."""


@dataclass
class ShardContext:
    """Everything one shard run needs, resolved from the run dir and shard id."""

    store: RunStore
    shard_id: str
    engine: Engine
    fingerprint: str

    @property
    def layout(self) -> RunLayout:
        return self.store.layout

    @property
    def manifest(self) -> Manifest:
        return self.store.manifest

    @property
    def shard_dir(self) -> str:
        return self.layout.shard_dir(self.shard_id)


def _open_run(run_dir: str, shard_id: str) -> tuple[RunStore, Engine]:
    """The run's store (manifest read) and the shard's engine, built without loading its model.

    Raises:
        BadInputError: no manifest, or the shard is not in it.
        ConfigError: invalid engine/worker config or model path.
    """
    store = RunStore.open(run_dir)
    layout = store.layout
    try:
        manifest = store.manifest
    except FileNotFoundError:
        raise BadInputError(f"run_dir: no manifest at {layout.manifest_uri}") from None
    except ConfigError:
        raise
    except (KeyError, ValueError, TypeError) as exc:
        raise BadInputError(f"manifest {layout.manifest_uri} is invalid: {exc!r}") from None
    try:
        manifest.shard(shard_id)
    except KeyError as exc:
        raise BadInputError(f"shard: {exc.args[0]}") from None
    config = manifest.engine_config  # parsed and validated once, when the manifest was read
    return store, engine_class(config.kind)(config, manifest.worker)


def load_context(run_dir: str, shard_id: str) -> ShardContext:
    """Read the manifest, build the engine (no model load yet) and compute the result fingerprint.

    Raises:
        BadInputError: no manifest, or the shard is not in it.
        ConfigError: invalid engine/worker config or model path.
    """
    store, engine = _open_run(run_dir, shard_id)
    manifest = store.manifest
    fingerprint = result_fingerprint(manifest.config_fingerprint, engine.model_digest(), engine.resolved_settings())
    fingerprint = adopt_pin(run_dir, manifest, engine, fingerprint)
    return ShardContext(store=store, shard_id=shard_id, engine=engine, fingerprint=fingerprint)


def adopt_pin(run_dir: str, manifest: Manifest, engine: Engine, fingerprint: str) -> str:
    """The fingerprint this shard runs under when the plan task carried shards over
    (:mod:`batch_contract.carryover`): their fingerprint, by adopting the settings their host resolved
    (``Engine.pin_resolved``), so one run never mixes fingerprints.

    Raises:
        ConfigError: this host cannot run the pinned settings, or the pin does not match this run's
            model and config (the message says how to run the shard anyway).
    """
    plan = RunStore.open(run_dir).carryover_plan()
    pinned = (plan.pinned if plan else {}).get("fingerprint")
    if not pinned or pinned == fingerprint:
        return fingerprint
    resolved = plan.pinned.get("resolved") or {}
    engine.pin_resolved(resolved)
    adopted = result_fingerprint(manifest.config_fingerprint, engine.model_digest(), engine.resolved_settings())
    if adopted != pinned:
        raise ConfigError(
            f"this run carried shards over with fingerprint {pinned} (resolved {resolved}); this host's "
            f"fingerprint is {adopted}: rerun with params.reuse='off', or set the engine dtype explicitly")
    log.info("fingerprint %s: adopted the carried shards' resolved settings %s", pinned, resolved)
    return adopted


def complete_before_load(run_dir: str, shard_id: str) -> ShardMarker | None:
    """The shard's marker when it already completes the shard under this run's config and model, decided
    before anything imports the engine's libraries (torch, vLLM): a retried or rescheduled worker of a
    complete shard exits at once (issue #35: in about the time of reading the manifest and hashing the
    model files).

    The marker completes the shard when its fingerprint is the run's pinned one (the plan carried shards
    over: :func:`adopt_pin`), else one of the fingerprints this config and model give under any setting
    the engine may resolve on some host (:meth:`Engine.possible_resolved_settings`, e.g. the encoder's
    ``dtype: auto`` as bf16 or fp32): the rows were computed for this run, so a host that would resolve
    the other way does not redo them. Anything else (no marker, not complete, unreadable, another config
    or model) is ``None``: the full path (:func:`load_context`, :func:`existing_marker`) decides.

    Raises:
        BadInputError / ConfigError: as :func:`load_context` (the manifest or the engine config).
    """
    store = RunStore.open(run_dir)
    try:
        marker = store.marker(shard_id)
    except (ValueError, TypeError, KeyError):
        return None
    if marker is None or not is_complete(marker):
        return None
    store, engine = _open_run(run_dir, shard_id)
    plan = store.carryover_plan()
    pinned = (plan.pinned if plan else {}).get("fingerprint")
    if pinned:
        return marker if marker.fingerprint == pinned else None
    digest = engine.model_digest()
    config_fp = store.manifest.config_fingerprint
    candidates = {result_fingerprint(config_fp, digest, s) for s in engine.possible_resolved_settings()}
    return marker if marker.fingerprint in candidates else None


def existing_marker(ctx: ShardContext) -> ShardMarker | None:
    """The shard's marker if it exists and matches the fingerprint; a stale one is deleted."""
    marker = ctx.store.marker(ctx.shard_id)
    if marker is None:
        return None
    if is_complete(marker, ctx.fingerprint):
        return marker
    log.warning("shard %s: marker has fingerprint %s, current is %s: redoing the shard",
                ctx.shard_id, marker.fingerprint, ctx.fingerprint)
    ctx.store.delete_marker(ctx.shard_id)
    return None


@dataclass
class _UnitsState:
    """What a :class:`ShardRun` keeps across the units it computes (``worker.steal``): the ledger it
    started from (chunk numbers), the shard-wide validator, the chunk sizer, and the units whose rows the
    validator has seen."""

    ledger: Ledger
    validator: Validator
    sizer: ChunkSizer
    classified: set[int] = field(default_factory=set)


def new_attempt_id() -> str:
    """``<UTC compact time, microseconds>-<8 hex>``, e.g. ``20261130T024300.123456Z-1a2b3c4d``: sorts by
    start time, unique across pods."""
    now = time.time()
    micros = int((now % 1) * 1_000_000)
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}.{micros:06d}Z-{uuid.uuid4().hex[:8]}"


class ShardRun:
    """One attempt at one shard (see the module docstring). Use :func:`run_shard`.

    Args:
        ctx: the shard's context.
        thief: with ``worker.steal``: this attempt is a worker of another shard computing units of this
            one (:meth:`run_stolen`), with the model that worker loaded.
        stop: the stop request to obey (a thief shares its worker's); ``None``: a new one.
    """

    def __init__(self, ctx: ShardContext, *, thief: bool = False, stop: StopSignal | None = None) -> None:
        self.ctx = ctx
        self.thief = thief
        self.spec = ctx.manifest.shard(ctx.shard_id)
        self.settings = ctx.manifest.worker
        self.clock = StageClock()
        self.cpu0 = cpu_seconds()
        self.attempt = AttemptRecord(
            attempt_id=new_attempt_id(),
            shard_id=ctx.shard_id,
            started_at=utc_now(),
            # the pod's name on Kubernetes (the downward API: batch_inference.pod_spec.POD_NAME_ENV), else
            # the host's
            host=os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname(),
            fingerprint=ctx.fingerprint,
            host_facts=host_facts(),
        )
        self.attempt_uri = join_uri(ctx.layout.attempts_dir(ctx.shard_id), f"{self.attempt.attempt_id}.json")
        self.counters = Counters(self.spec.rows, 0)
        self.stop = stop or StopSignal(self.settings.grace_seconds, on_hard_exit=self._on_hard_exit)
        self.gpu = GpuSampler()
        self.status = ShardStatus.RUNNING.value
        self.steady_t0: float | None = None
        self.steady_rows = 0
        self.steady_rate = 0.0
        self.reuse_on = reuse_enabled(ctx.engine, self.settings, ctx.manifest.input)
        self.deduper: Deduper | None = None
        """One result per key (``batch_worker.dedupe``): set in :meth:`run` for engines that reuse results."""
        self._attempt_lock = threading.Lock()
        self.documents: DocumentPool | None = None
        self.engine_busy = 0.0
        if self.settings.steal:
            self.attempt.steal = {"role": "thief" if thief else "owner", "units": 0}
        self._leases: list[Lease] = []
        """The unit leases of the claim this attempt computes (``worker.steal``); chunks commit only while
        every one of them holds."""
        self._abandon = threading.Event()
        """Set when the unit's lease was lost: its producer stops and nothing more of it is committed (one
        event per unit, so a producer left from an abandoned unit never starts reading again)."""
        self._units_state: _UnitsState | None = None
        self._thief_run: ShardRun | None = None
        """The thief attempt this worker runs on another shard now (its record is written on a hard exit)."""
        self._chunk_no: int | None = None
        self._attempt_written = False
        self._steal_failed: set[str] = set()
        self._steal_stop_logged = False
        """Shards whose units raised here (``_steal_once``): not taken again by this worker."""

    # -- attempt record -------------------------------------------------------------------------------
    def _write_attempt(self, status: str | None = None, exit_code: int | None = None) -> None:
        with self._attempt_lock:  # the main thread and the progress thread's tick both write it
            self._write_attempt_locked(status, exit_code)

    def _progress_tick(self) -> None:
        """Refresh the attempt record while it runs (a killed attempt keeps its last tick's figures)."""
        if self.attempt.exit_code is None:
            self._write_attempt()

    def _write_attempt_locked(self, status: str | None, exit_code: int | None) -> None:
        self._attempt_written = True
        a = self.attempt
        if status is not None:
            a.status = status
        if exit_code is not None:
            a.exit_code = exit_code
            a.ended_at = utc_now()
        a.rows_committed = self.counters.rows_committed
        a.rows_processed = self.counters.rows_processed
        a.stage_seconds = self.clock.rounded(include_open=True)
        a.updated_at = utc_now()
        a.cpu_seconds = round(cpu_seconds() - self.cpu0, 3)
        a.steady_rows_per_s = round(self.steady_rate, 2)
        a.gpu = self.gpu.summary()
        if self.documents is not None:
            a.preprocess = self._preprocess_figures()
        storage.write_replace(self.attempt_uri, a.to_json_bytes())

    def _preprocess_figures(self) -> dict[str, float | int]:
        """This attempt's ``preprocess`` figures (``batch_contract.marker.PREPROCESS_FIELDS``)."""
        st = self.documents.stats if self.documents is not None else None
        if st is None:
            return {}
        return {"rows": st.rows, "cpu_seconds": round(st.cpu_seconds, 3), "wall_seconds": round(st.wall_seconds, 3),
                "extract_seconds": round(st.extract_seconds, 3),
                "engine_wait_seconds": round(self.clock.rounded(include_open=True).get("idle", 0.0), 3),
                "engine_busy_seconds": round(self.engine_busy, 3),
                "pool_workers": st.pool_workers, "queue_depth": st.queue_depth}

    def _on_hard_exit(self, why: str) -> None:
        thief = self._thief_run
        if thief is not None and thief._attempt_written:
            thief._write_attempt(ShardStatus.INTERRUPTED.value, int(ExitCode.INTERRUPTED))
        if self.status != ShardStatus.COMPLETE.value:
            self._write_attempt(ShardStatus.INTERRUPTED.value, int(ExitCode.INTERRUPTED))

    # -- main -------------------------------------------------------------------------------------------
    def run(self, install_signals: bool = True) -> int:
        """Run the attempt; returns the exit code (0 complete, 75 interrupted). Other errors raise."""
        if install_signals:  # before the attempt record: a worker whose record exists handles SIGTERM
            self.stop.install()
        progress = None
        try:
            storage.makedirs(self.ctx.shard_dir)
            self._write_attempt()
            ledger = self._build_ledger()
            result_log = None
            if self.reuse_on and not self.settings.steal:  # with stealing: per unit, under its lease
                outcome = self._reuse(ledger)
                if outcome is None:
                    return self._interrupted(None)
                result_log = outcome.log
                ledger = self._build_ledger()
                if outcome.rows_to_compute == 0 and ledger.rows_done == self.spec.rows:
                    self.gpu.stop()
                    self._finish(self._without_model(outcome))  # every row reused: no model load
                    self.status = ShardStatus.COMPLETE.value
                    return int(ExitCode.OK)
            if self.ctx.engine.reuses_results:
                self.deduper = Deduper(self.ctx.engine, result_log, self.ctx.fingerprint)
            planned = self.ctx.engine.planned_device()  # engines whose batch settings are load arguments
            tuned = planned is not None and self._apply_canary_tuning(planned)
            spec = self.ctx.manifest.input
            if spec.documents is not None:  # its processes start while the model loads
                self.documents = DocumentPool(spec.documents, spec.roots).start()
                log.info("shard %s: documents (%s): %d extraction process(es), window %d", self.ctx.shard_id,
                         spec.documents.preprocess, self.documents.workers, self.documents.depth)
            if self.stop.requested:  # a signal before the load: nothing to compute, the record says why
                return self._interrupted(None)
            with self.clock.stage("model_load"):
                loaded = self.ctx.engine.load()
            self.gpu.start(loaded.info.get("device_uuid"))  # after the load: the device this process uses
            if loaded.model_digest != self.ctx.engine.model_digest():
                raise RuntimeError("model files changed while loading; retry")
            if planned is None:
                tuned = self._apply_canary_tuning(str(loaded.info.get("device")))
            if tuned:
                loaded.info["tuned_by"] = "canary"
            self.attempt.threads = apply_thread_cap()
            self.counters.rows_before = ledger.rows_done - self.counters.rows_committed  # reuse pass counted
            self.ctx.engine.on_rows_done = self.counters.add_processed
            progress = ProgressReporter(
                self.ctx.layout.progress_uri(self.ctx.shard_id), self.ctx.shard_id, self.attempt.attempt_id,
                self.counters, self.settings.progress_interval_seconds, status=lambda: self.status,
                on_tick=self._progress_tick,
            ).start()
            if self.settings.steal:
                return self._run_stealing(loaded, ledger, progress)
            finished = self._process_all(loaded, ledger)
            if not finished:
                return self._interrupted(progress)
            self._complete(loaded, progress)
            return int(ExitCode.OK)
        except BaseException as exc:
            self.status = ShardStatus.FAILED.value
            code = ExitCode.BAD_INPUT if isinstance(exc, ConfigError | BadInputError) else ExitCode.FAILURE
            self.gpu.stop()
            if progress is not None:
                progress.stop()
            try:
                self._write_attempt(self.status, int(code))
            except OSError:
                log.exception("could not write the attempt record")
            raise
        finally:
            if self.documents is not None:
                self.documents.close()
            if install_signals:
                self.stop.uninstall()

    def _apply_canary_tuning(self, device: str) -> bool:
        """Batch with the settings the run's canary chose (``canary.json``) when the run leaves them to it
        (``Engine.tunable``: the encoder's ``token_budget`` 0, the LLM's ``max_num_seqs`` and
        ``max_num_batched_tokens`` unset) and the canary ran on ``device`` (the engine info's
        ``device``); True when the engine took them (the caller records ``tuned_by: canary`` in the
        marker's engine info)."""
        if not self.ctx.engine.tunable():
            return False
        try:
            canary = self.ctx.store.canary()
        except ValueError as exc:
            log.warning("shard %s: ignoring unreadable canary.json: %s", self.ctx.shard_id, exc)
            return False
        if canary is None or canary.device != device:
            return False
        return bool(self.ctx.engine.apply_tuning(canary.chosen["token_budget"], canary.chosen["max_batch_rows"]))

    def _complete(self, loaded: LoadedModel, progress: ProgressReporter) -> None:
        """Every row of the own shard is committed: stop the GPU sampler and progress, write the marker
        (:meth:`_finish`) and the ``complete`` progress state."""
        self.gpu.stop()
        progress.stop()
        self._finish(loaded)
        self.status = ShardStatus.COMPLETE.value
        progress.write(self.status)

    def _interrupted(self, progress: ProgressReporter | None) -> int:
        """Record the interruption (signal) and return exit code 75."""
        self.status = ShardStatus.INTERRUPTED.value
        self.gpu.stop()
        self._write_attempt(self.status, int(ExitCode.INTERRUPTED))
        if progress is not None:
            progress.stop()
            progress.write(self.status)
        log.warning("shard %s: interrupted by %s; committed %d rows this attempt, exiting %d",
                    self.ctx.shard_id, self.stop.signal_name, self.counters.rows_committed,
                    int(ExitCode.INTERRUPTED))
        return int(ExitCode.INTERRUPTED)

    def _build_ledger(self) -> Ledger:
        """The shard's resume ledger; with ``worker.steal`` leaving temp files younger than
        :data:`STEAL_TEMP_MIN_AGE_SECONDS` (other workers' commits in flight into the same shard)."""
        age = STEAL_TEMP_MIN_AGE_SECONDS if self.settings.steal else 0.0
        return build_ledger(self.ctx.shard_dir, self.ctx.fingerprint, temp_min_age_seconds=age)

    # -- work stealing (worker.steal) -----------------------------------------------------------------
    def _run_stealing(self, loaded: LoadedModel, ledger: Ledger, progress: ProgressReporter) -> int:
        """The owner's run with ``worker.steal``: its own units in order; while units of its shard are
        held by other workers, units of other shards; then the marker; then :meth:`_help_until_done`.
        Returns the exit code."""
        own = self.run_units(loaded, ledger)
        while own is None:  # every unit left of this shard is held by another worker
            took = self._steal_once(loaded)
            if took is False:
                return self._interrupted(progress)
            own = self.run_units(loaded, None)
            if own is None and took is None:
                with self.clock.stage("idle"):
                    time.sleep(min(1.0, self.settings.lease_seconds / 10))
        if own is False:
            return self._interrupted(progress)
        self._complete(loaded, progress)
        self._help_until_done(loaded)  # the own shard is complete: an interruption now loses nothing of it
        return int(ExitCode.OK)

    def _help_until_done(self, loaded: LoadedModel) -> None:
        """Take units of other shards until every other shard has a marker: while the units left are held
        by other workers, wait (a holder may be stopped, release its unit or die and let its lease
        expire: then this worker takes it over), so a shard whose own worker never starts is finished
        even when the worker computing it is preempted. Returns at once on a stop request, a budget or
        deadline stop (``stealing.steal_stop_reason``), or when the only shards left failed here. The
        seconds spent waiting go to this attempt's ``steal.wait_seconds`` (after its marker: not in the
        shard's stage seconds)."""
        poll = min(1.0, self.settings.lease_seconds / 10)
        waited = 0.0
        while not self.stop.requested:
            if not unfinished_shards(self.ctx.store, self.ctx.shard_id, self._steal_failed):
                break  # one listing of the markers: a last worker exits without listing every claim
            took = self._steal_once(loaded)
            if took is False:
                break
            if took:
                continue
            if steal_stop_reason(self.ctx.store) is not None or not unfinished_shards(
                    self.ctx.store, self.ctx.shard_id, self._steal_failed):
                break
            time.sleep(poll)
            waited += poll
        if waited:
            self.attempt.steal["wait_seconds"] = round(waited, 3)
            self._write_attempt()

    def _steal_once(self, loaded: LoadedModel) -> bool | None:
        """Take units of the run's shard with the most claimable rows (``stealing.pick_victim``) as a
        thief attempt (:meth:`run_stolen`). Returns ``True`` when a shard was worked on, ``False`` when a
        stop request interrupted it, ``None`` when no shard has a claimable unit or the run stopped
        stealing (budget stop, deadline: ``stealing.steal_stop_reason``)."""
        store, s = self.ctx.store, self.settings
        if self.stop.requested:
            return False
        reason = steal_stop_reason(store)
        if reason is not None:
            if not self._steal_stop_logged:
                log.info("shard %s: taking no units of other shards: %s", self.ctx.shard_id, reason)
                self._steal_stop_logged = True
            return None
        victim = pick_victim(store, self.ctx.shard_id, s.steal_unit_rows, s.lease_seconds, skip=self._steal_failed)
        if victim is None:
            return None
        log.info("shard %s: taking units of shard %s (%d rows in %d claimable units)", self.ctx.shard_id,
                 victim.shard_id, victim.rows, victim.units)
        ctx = ShardContext(store=store, shard_id=victim.shard_id, engine=self.ctx.engine, fingerprint=self.ctx.fingerprint)
        thief = ShardRun(ctx, thief=True, stop=self.stop)
        self._thief_run = thief
        try:
            return thief.run_stolen(loaded)
        except Exception:  # noqa: BLE001 - another shard's failure (its input, its rows) is not this worker's
            log.exception("shard %s: computing units of shard %s failed; leaving that shard to its own worker",
                          self.ctx.shard_id, victim.shard_id)
            self._steal_failed.add(victim.shard_id)
            return True
        finally:
            self._thief_run = None

    def run_stolen(self, loaded: LoadedModel) -> bool:
        """A thief attempt (``thief=True``): claim units of this shard from its tail and compute them with
        ``loaded`` until none is claimable; write the shard's marker when every unit is done. Its attempt
        record (``steal.role: thief``) is written once it claims a unit or writes the marker, so its
        seconds are charged to the shard it worked on. Returns ``False`` when a stop request interrupted
        it (its unit's lease released), else ``True``.

        Raises:
            CoverageError: every unit is done but the committed rows do not cover the shard.
        """
        try:
            storage.makedirs(self.ctx.shard_dir)
            if self.ctx.engine.reuses_results:
                self.deduper = Deduper(self.ctx.engine, None, self.ctx.fingerprint)
            done = self.run_units(loaded, None, from_tail=True)
            if done is False:
                self.status = ShardStatus.INTERRUPTED.value
                self._write_attempt(self.status, int(ExitCode.INTERRUPTED))
                return False
            if done is True and not self.ctx.store.is_complete(self.ctx.shard_id, self.ctx.fingerprint):
                self._finish(loaded)
            elif self._attempt_written:
                self._write_attempt(ShardStatus.COMPLETE.value, int(ExitCode.OK))
            self.status = ShardStatus.COMPLETE.value
            return True
        except BaseException:
            if self._attempt_written:
                self._write_attempt(ShardStatus.FAILED.value, int(ExitCode.FAILURE))
            raise

    def run_units(self, loaded: LoadedModel, ledger: Ledger | None, from_tail: bool = False) -> bool | None:
        """Claim and compute this shard's units (:mod:`batch_contract.claims`) until none is claimable.

        Each claim takes up to :func:`~batch_contract.claims.claim_units` consecutive units (several
        while much of the shard is unclaimed, one near its end; one for the first claim of this call, then
        at most what this worker computed in ``CLAIM_SECONDS`` on its last claim), computed together
        (:meth:`_run_claim`).

        Args:
            loaded: the loaded model.
            ledger: the shard's resume ledger when just built (``None``: built here when needed).
            from_tail: claim from the last unit down (a thief: the owner claims from the first up).

        Returns:
            ``True`` when every unit is done (by any worker), ``False`` on a stop request, ``None`` when
            the units left are held by other workers (or, for a thief, the run stopped stealing).
        """
        units = unit_segments(self.spec.segments, self.settings.steal_unit_rows)
        book = ClaimBook(self.ctx.shard_dir, len(units), self.settings.lease_seconds)
        workers = sum(1 for s in self.ctx.manifest.shards if s.rows)
        rate = None  # units per wall second of this worker's last claim: sizes the next (claim_units)
        while True:
            if self.stop.requested:
                return False
            pending = [st for st in book.states() if not st.done]
            if not pending:
                return True
            if self.thief and steal_stop_reason(self.ctx.store) is not None:
                return None
            want = claim_units(sum(1 for st in pending if st.generation < 0), workers, rate)
            leases = claim_adjacent(book, list(reversed(pending)) if from_tail else pending, want,
                                    self.attempt.attempt_id, shard_owner=not self.thief)
            if not leases:
                return None
            started = time.monotonic()
            if not self._run_claim(loaded, book, leases, units, ledger):
                return False
            rate = len(leases) / max(time.monotonic() - started, 1e-3)
            ledger = None

    def _units_state_for(self, ledger: Ledger | None) -> _UnitsState:
        if self._units_state is None:
            ledger = ledger or self._build_ledger()
            validator = Validator(self.ctx.manifest.input.id_column, ledger.done_ids, ledger.done_dead,
                                  text_column=self.ctx.manifest.input.text_column)
            self._units_state = _UnitsState(ledger=ledger, validator=validator, sizer=ChunkSizer(self.settings))
            self.counters.rows_before = ledger.rows_done - self.counters.rows_committed
        return self._units_state

    def _run_claim(self, loaded: LoadedModel, book: ClaimBook, leases: list[Lease], units: list[list],
                   ledger: Ledger | None) -> bool:
        """Compute the claimed units (adjacent, ``leases`` by unit number) as one stretch of rows under
        their leases (renewed meanwhile) and mark them done. A committed part may hold rows of several
        of these units, never of a unit this worker does not hold. Returns ``False`` on a stop request
        (the leases released, finished chunks committed), else ``True`` (also when a lease was lost: the
        units still held are released for their next holders)."""
        state = self._units_state_for(ledger)
        if not self._attempt_written:
            self._write_attempt()
        segments = [seg for lease in leases for seg in units[lease.unit]]
        keeper = LeaseKeeper(book, leases).start()
        self._leases, self._abandon = leases, threading.Event()
        finished, outcome = False, None
        try:
            refresh = any(lease.generation > 0 for lease in leases)  # an earlier holder may have committed rows
            if self.reuse_on:
                outcome = self._reuse(self._build_ledger(), segments)
                if outcome is not None:
                    refresh = refresh or bool(outcome.files)
                    if self.ctx.engine.reuses_results:
                        self.deduper = Deduper(self.ctx.engine, outcome.log, self.ctx.fingerprint)
            if refresh:
                fresh = self._build_ledger()
                state.validator.done_ids |= fresh.done_ids
                state.validator.done_dead |= fresh.done_dead
            if not self.reuse_on or outcome is not None:
                self._classify_before(state, units, leases[0].unit)
                finished = self._loop(loaded, state.ledger, state.sizer, state.validator, segments=segments)
                state.classified.update(lease.unit for lease in leases)
        except BaseException:
            keeper.stop()
            self._release(book, leases)  # the next worker need not wait for the expiry (see _steal_once)
            raise
        finally:
            keeper.stop()
            self._leases = []
        if finished and not self._abandon.is_set() and all(lease.safe_to_commit() for lease in leases):
            for lease in leases:
                book.mark_done(lease.unit)
            self.attempt.steal["units"] = self.attempt.steal.get("units", 0) + len(leases)
            self._write_attempt()
            return True
        self._release(book, leases)
        return not self.stop.requested

    @staticmethod
    def _release(book: ClaimBook, leases: list[Lease]) -> None:
        """Release the leases still held (a lost one is its next holder's and is left alone)."""
        for lease in leases:
            try:
                book.release(lease)
            except OSError:
                log.exception("could not release the lease of unit %d", lease.unit)

    def _classify_before(self, state: _UnitsState, units: list[list], unit: int) -> None:
        """Let the validator see the rows of this shard's units before ``unit`` that it has not seen, so a
        ``duplicate_id`` is decided in shard order whichever worker computes which unit (reads the
        input; computes and commits nothing)."""
        spec = self.ctx.manifest.input
        for k in range(unit):
            if k in state.classified:
                continue
            with self.clock.stage("input_read"):
                for block in iter_shard_blocks(spec, units[k], self.settings.read_batch_rows, (), self.settings):
                    state.validator.validate(block)
            state.classified.add(k)

    # -- result cache ---------------------------------------------------------------------------------
    def _reuse(self, ledger: Ledger, segments: list | None = None) -> ReuseOutcome | None:
        """The reuse pass (``batch_worker.reuse``): commit cached rows before the model loads (with
        ``worker.steal``: of one unit's ``segments``, under its lease)."""
        ctx = self.ctx
        with self.clock.stage("reuse"):
            outcome = reuse_pass(
                engine=ctx.engine, output_root=ctx.layout.output_root, run_id=ctx.manifest.run_id, shard_id=ctx.shard_id,
                shard_dir=ctx.shard_dir, fingerprint=ctx.fingerprint, spec=ctx.manifest.input,
                segments=self.spec.segments if segments is None else segments, settings=self.settings, ledger=ledger,
                should_stop=lambda: self.stop.requested,
            )
        if outcome is None:
            return None
        self.attempt.files.update(outcome.files)
        self.attempt.rows_reused += outcome.rows_reused
        self.attempt.reuse_seconds_avoided = round(self.attempt.reuse_seconds_avoided + outcome.seconds_avoided, 6)
        if outcome.files:
            self.attempt.chunks_committed += len(outcome.files)
        self.counters.add_committed(outcome.rows_reused + outcome.dead_committed, outcome.dead_committed, 0)
        self._write_attempt()
        return outcome

    def _without_model(self, outcome: ReuseOutcome) -> LoadedModel:
        """What the marker needs of a model that was never loaded (every row came from the cache)."""
        engine = self.ctx.engine
        schema = outcome.part_schema or pa.schema([])
        info = {"engine": engine.kind.value, "model_loaded": False, "model_digest": engine.model_digest(),
                **engine.resolved_settings()}
        return LoadedModel(model_digest=info["model_digest"], info=info, part_schema=schema)

    def _process_all(self, loaded: LoadedModel, ledger: Ledger) -> bool:
        """Run the producer/engine/commit loop; True when every row was handed over and committed."""
        sizer = ChunkSizer(self.settings)
        validator = Validator(self.ctx.manifest.input.id_column, ledger.done_ids, ledger.done_dead,
                              text_column=self.ctx.manifest.input.text_column)
        return self._loop(loaded, ledger, sizer, validator)

    def _loop(self, loaded: LoadedModel, ledger: Ledger, sizer: ChunkSizer, validator: Validator,
              segments: list | None = None) -> bool:
        abandon = self._abandon
        producer = Producer(
            self.ctx.engine, self.ctx.manifest.input, self.spec.segments if segments is None else segments,
            self.settings, validator, sizer, self.clock, lambda: self.stop.requested or abandon.is_set(),
            self.deduper, documents=self.documents,
        ).start()
        try:
            return self._consume(producer, loaded, ledger, sizer)
        finally:
            if not producer.close():
                log.warning("shard %s: the producer thread did not end within %.0f s", self.ctx.shard_id,
                            PRODUCER_JOIN_SECONDS)

    def _consume(self, producer: Producer, loaded: LoadedModel, ledger: Ledger, sizer: ChunkSizer) -> bool:
        """The engine/commit side of :meth:`_loop`: take chunks until the producer is done or a stop."""
        chunk_no = ledger.next_chunk if self._chunk_no is None else self._chunk_no
        chunks_done = 0
        self._last_chunk_complete = True
        while True:
            with self.clock.stage("idle"):
                work = producer.get()
            if work is None:
                return producer.exhausted
            t0 = time.perf_counter()
            interrupted = self._run_chunk(work, loaded, chunk_no)
            self.engine_busy += time.perf_counter() - t0
            chunk_no += 1
            self._chunk_no = chunk_no
            chunks_done += 1
            sizer.update(len(work.rows), time.perf_counter() - t0)
            self._update_steady(chunks_done, len(work.rows))
            self.attempt.rows_skipped_resume = producer.rows_skipped
            self._write_attempt()
            release_memory()
            if interrupted or self.stop.requested:
                # a signal that arrives after the last chunk was committed still lets the shard complete
                return not interrupted and producer.only_done_left()

    def _update_steady(self, chunks_done: int, rows: int) -> None:
        now = time.perf_counter()
        if chunks_done == 1:
            self.steady_t0 = now
            self.steady_rate = rows / max(self.clock.seconds["inference"], 1e-9)
            return
        self.steady_rows += rows
        self.steady_rate = self.steady_rows / max(now - (self.steady_t0 or now), 1e-9)

    def _run_chunk(self, work: ChunkWork, loaded: LoadedModel, chunk_no: int) -> bool:
        """Process and commit one chunk; returns whether the engine was interrupted."""
        self._last_chunk_complete = False
        rows = work.rows
        t0 = time.perf_counter()
        if len(rows) and not self.stop.requested:
            out = self.ctx.engine.process(work.prepared, self.stop)
        else:
            out = ChunkOutput(table=loaded.part_schema.empty_table().select(["id"]), interrupted=bool(len(rows)))
        for stage, seconds in out.stage_seconds.items():
            self.clock.add(stage, seconds)
        check_chunk_output(rows, out)
        processed = out.table.num_rows + len(out.rejects)
        if work.split is not None and self.deduper is not None:
            settled = self.deduper.settle(
                work.split, out, loaded.part_schema, compute_more=self._compute_more,
                seconds=lambda: time.perf_counter() - t0,
                origin=resultcache.origin_of(self.ctx.manifest.run_id, self.ctx.shard_id,
                                             f"{self.attempt.attempt_id}/chunk-{chunk_no:05d}"))
            rows, out, processed = settled.rows, settled.output, settled.processed
        where = {rid: i for i, rid in enumerate(rows.ids)}
        dead = list(work.dead) + [
            DeadLetter(r.id, r.reason, r.detail, rows.source_uri[where[r.id]], rows.source_row[where[r.id]])
            for r in out.rejects
        ]
        n_ok = out.table.num_rows
        lost = [lease.unit for lease in self._leases if not lease.safe_to_commit()]
        if lost and (dead or n_ok):
            log.warning("shard %s: lease of unit(s) %s lost before a commit: %d rows left to their next holders",
                        self.ctx.shard_id, lost, n_ok + len(dead))
            self._abandon.set()
            return True
        with self.clock.stage("write"):
            if dead:
                table = dead_letter_table(dead, self.ctx.fingerprint)
                self._record(commit_table(self.ctx.shard_dir, DEAD_LETTER_PREFIX, chunk_no, table))
            if n_ok:
                part = assemble_part(rows, out, self.ctx.fingerprint, loaded.part_schema)
                self._record(commit_table(self.ctx.shard_dir, PART_PREFIX, chunk_no, part))
        if dead or n_ok:
            self.attempt.chunks_committed += 1
        self.attempt.tokens_real += out.tokens.real
        self.attempt.tokens_padded += out.tokens.padded
        self.counters.add_committed(n_ok + len(dead), len(dead), processed)
        self._last_chunk_complete = not out.interrupted
        return out.interrupted

    def _compute_more(self, rows: ChunkRows) -> ChunkOutput:
        """Prepare and process ``rows`` now (copies no other row settles: ``Deduper.settle``)."""
        with self.clock.stage("tokenize"):
            prepared = self.ctx.engine.prepare(rows)
        out = self.ctx.engine.process(prepared, self.stop)
        for stage, seconds in out.stage_seconds.items():
            self.clock.add(stage, seconds)
        check_chunk_output(rows, out)
        return out

    def _record(self, committed: tuple[str, dict]) -> None:
        name, digest = committed
        self.attempt.files[name] = digest

    # -- completion ---------------------------------------------------------------------------------------
    def _finish(self, loaded: LoadedModel) -> None:
        """Verify coverage, rewrite the attempt record, then write the marker (last)."""
        ctx = self.ctx
        with self.clock.stage("write"):
            ledger = self._build_ledger()
            if ledger.rows_done != self.spec.rows:
                raise CoverageError(
                    f"shard {ctx.shard_id}: {len(ledger.done_ids)} results + {len(ledger.done_dead)} dead letters "
                    f"!= {self.spec.rows} input rows; no marker written"
                )
            marker = self._marker(loaded, ledger)
        self._write_attempt(ShardStatus.COMPLETE.value, int(ExitCode.OK))
        marker.attempts = self._attempts()
        marker.files = self._file_records(ledger, marker.attempts)
        marker.stage_seconds = _sum_stages(marker.attempts)
        marker.cpu_seconds = round(sum(a.get("cpu_seconds", 0.0) for a in marker.attempts), 3)
        marker.tokens_padded = sum(a.get("tokens_padded", 0) for a in marker.attempts)
        marker.tokens_real = sum(a.get("tokens_real", 0) for a in marker.attempts)
        marker.reuse_seconds_avoided = round(sum(a.get("reuse_seconds_avoided", 0.0) for a in marker.attempts), 6)
        marker.preprocess = sum_preprocess(marker.attempts)
        if self.settings.steal:
            marker.steal = steal_figures(marker.attempts, len(unit_segments(self.spec.segments,
                                                                            self.settings.steal_unit_rows)))
        marker.finished_at = utc_now()
        marker.started_at = min((a["started_at"] for a in marker.attempts), default=self.attempt.started_at)
        uri = ctx.layout.marker_uri(ctx.shard_id)
        # create-only; a marker already in place under this fingerprint wins, any other raises (ADR 0002)
        if not ctx.store.write_marker(marker):
            log.info("shard %s: another attempt wrote the marker first", ctx.shard_id)
        log.info("shard %s: complete: %d results, %d dead letters, marker %s",
                 ctx.shard_id, marker.rows_ok, marker.rows_dead_letter, uri)

    def _marker(self, loaded: LoadedModel, ledger: Ledger) -> ShardMarker:
        ctx = self.ctx
        truncated = repaired = reused = 0
        # tokens_real (set by _finish, like tokens_padded) is the attempts' sum of what the engine itself
        # processed: copies of identical inputs (batch_worker.dedupe) and parts the run's canary committed
        # into the shard (canary.json's figures) are not computed tokens of this shard
        for name in ledger.parts:
            t = read_parquet_columns(join_uri(ctx.shard_dir, name), ["n_tokens", "truncated", "text_repaired"])
            if is_reused_part(name):
                reused += t.num_rows
            truncated += int(pc.sum(t.column("truncated").cast("int64")).as_py() or 0)
            repaired += int(pc.sum(t.column("text_repaired").cast("int64")).as_py() or 0)
        llm_tokens = {"prompt_tokens": 0, "cached_tokens": 0, "output_tokens": 0}  # LLM part columns
        if "prompt_tokens" in loaded.part_schema.names:
            for name in ledger.parts:
                t = read_parquet_columns(join_uri(ctx.shard_dir, name), list(llm_tokens))
                for col in llm_tokens:
                    llm_tokens[col] += int(pc.sum(t.column(col)).as_py() or 0)
        reasons: dict[str, int] = {}
        for name in ledger.dead_letter_parts:
            t = read_parquet_columns(join_uri(ctx.shard_dir, name), ["reason"])
            for reason in t.column("reason").to_pylist():
                reasons[reason] = reasons.get(reason, 0) + 1
        # tokens_padded is the attempts' sum, set by _finish
        tokens = TokenCounts(prompt=llm_tokens["prompt_tokens"], cached=llm_tokens["cached_tokens"],
                             output=llm_tokens["output_tokens"])
        return ShardMarker(
            run_id=ctx.manifest.run_id,
            shard_id=ctx.shard_id,
            fingerprint=ctx.fingerprint,
            rows_input=self.spec.rows,
            rows_ok=len(ledger.done_ids),
            rows_dead_letter=len(ledger.done_dead),
            rows_truncated=truncated,
            rows_text_repaired=repaired,
            dead_letter_reasons=reasons,
            **tokens.to_dict(),
            steady_rows_per_s=round(self.steady_rate, 2),
            engine={**loaded.info, "resolved": ctx.engine.resolved_settings()},
            gpu=self.gpu.summary(),
            parts=list(ledger.parts),
            dead_letter_parts=list(ledger.dead_letter_parts),
            files_quarantined=quarantined_count(ctx.shard_dir),
            rows_reused=reused,
            host_facts=dict(self.attempt.host_facts),
        )

    def _file_records(self, ledger: Ledger, attempts: list[dict]) -> dict[str, dict]:
        """Commit record (size, SHA-256) of every file in the ledger: from the attempt records, or read
        back for a file whose attempt was killed before rewriting its record."""
        known: dict[str, dict] = {}
        for a in attempts:
            known.update(a.get("files") or {})
        out = {}
        for name in ledger.parts + ledger.dead_letter_parts:
            out[name] = known.get(name) or digest_of(storage.read_bytes(join_uri(self.ctx.shard_dir, name)))
        return dict(sorted(out.items()))

    def _attempts(self) -> list[dict]:
        """Attempt records of this fingerprint, oldest first (killed attempts included)."""
        return [rec.to_dict() for rec in self.ctx.store.attempts(self.ctx.shard_id, self.ctx.fingerprint)]


def sum_preprocess(attempts: list[dict]) -> dict[str, float | int]:
    """The marker's ``preprocess`` figures: the attempts' figures summed (``pool_workers`` and
    ``queue_depth``: the last attempt's that has them); ``{}`` when no attempt extracted documents."""
    total: dict[str, float | int] = {}
    for a in attempts:
        figures = a.get("preprocess") or {}
        for k, v in figures.items():
            total[k] = v if k in ("pool_workers", "queue_depth") else round(total.get(k, 0) + v, 3)
    return total


def steal_figures(attempts: list[dict], units: int) -> dict[str, float | int]:
    """The marker's ``steal`` figures (``ShardMarker.steal``) from its attempt records: ``units`` of the
    shard, ``units_stolen`` (units done by ``thief`` attempts) and ``stolen_seconds`` (those attempts'
    stage seconds except ``idle``)."""
    thieves = [a for a in attempts if (a.get("steal") or {}).get("role") == "thief"]
    return {"units": units, "units_stolen": sum(int(a["steal"].get("units", 0)) for a in thieves),
            "stolen_seconds": round(sum(float(v) for a in thieves for k, v in (a.get("stage_seconds") or {}).items()
                                        if k != "idle"), 3)}


def _sum_stages(attempts: list[dict]) -> dict[str, float]:
    total: dict[str, float] = {}
    for a in attempts:
        for k, v in a.get("stage_seconds", {}).items():
            total[k] = round(total.get(k, 0.0) + float(v), 3)
    return total


def run_shard(run_dir: str, shard_id: str, install_signals: bool = True, stop: StopSignal | None = None) -> int:
    """Run shard ``shard_id`` of the run at ``run_dir``; returns an ``ExitCode`` value.

    Args:
        run_dir: ``<output_root>/runs/<run_id>`` (local path, ``file://`` or ``gs://``).
        shard_id: five-digit shard id.
        install_signals: install SIGTERM/SIGINT handlers for the run (main thread only); ignored with
            ``stop``.
        stop: the process's installed handler (``batch_worker.__main__.run``): it stays installed, gets
            the manifest's ``worker.grace_seconds`` and the attempt's hard-exit hook; a signal received
            before the attempt starts returns 75 with nothing written.

    Returns:
        0 complete (also: already complete under the same fingerprint, nothing written),
        75 interrupted by a signal after committing finished chunks.

    Raises:
        ConfigError / BadInputError: no retry can fix it (the CLI maps these to exit code 2).
        Exception: anything else (exit code 1).
    """
    marker = complete_before_load(run_dir, shard_id)
    if marker is not None:
        log.info("shard %s: already complete (fingerprint %s, %d rows): nothing to do",
                 shard_id, marker.fingerprint, marker.rows_input)
        return int(ExitCode.OK)
    ctx = load_context(run_dir, shard_id)
    marker = existing_marker(ctx)
    if marker is not None:
        log.info("shard %s: already complete (fingerprint %s, %d rows): nothing to do",
                 shard_id, ctx.fingerprint, marker.rows_input)
        return int(ExitCode.OK)
    if stop is None:
        return ShardRun(ctx).run(install_signals=install_signals)
    if stop.requested:
        log.warning("shard %s: %s received before the attempt started: nothing written, exiting %d",
                    shard_id, stop.signal_name, int(ExitCode.INTERRUPTED))
        return int(ExitCode.INTERRUPTED)
    attempt = ShardRun(ctx, stop=stop)
    stop.configure(ctx.manifest.worker.grace_seconds, attempt._on_hard_exit)
    try:
        return attempt.run(install_signals=False)
    finally:
        if stop.requested:  # end the engine's own workers (vLLM's engine core) before the hard exit
            try:
                ctx.engine.close()
            except Exception:
                log.exception("shard %s: closing the engine after the stop request failed", shard_id)
