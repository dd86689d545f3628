"""The pretraining loop: data → DeepSpeed engine → schedule → checkpoints → logs.

Everything that decides *what* happens at a step (data, learning rate, weight decay, checkpoints) is a pure
function of the step, so restarting the same command resumes from the newest complete state and ends with
the weights an uninterrupted run would have (bitwise on CPU at the same world size).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from trilm.atomic import copy_file, write_json, write_text
from trilm.config import ConfigError
from trilm.data.tokenizer import sidecar_path
from trilm.model.flops import flops_per_token
from trilm.model.quant import ramp_value, set_ramp
from trilm.model.snapshot import model_meta
from trilm.model.transformer import Decoder
from trilm.parallel import dp_group, init_parallel, node_id, placement
from trilm.schedule import Schedule
from trilm.store.errors import StoreError
from trilm.store.integrity import complete_steps, latest_complete
from trilm.store.layout import COMPLETE
from trilm.store.open import open_model
from trilm.store.snapshot import write_snapshot_files
from trilm.train.checkpoint import RunDir, RunLock, atomic_directory
from trilm.train.config import TrainConfig, changed_keys
from trilm.train.convert import (
    conversion_schedule,
    describe_recipe,
    ramp_lambda,
    reset_moments,
)
from trilm.train.distill import Teacher, check_teacher, check_teacher_tokenizer
from trilm.train.engine import (
    build_engine,
    discard_gradients,
    global_grad_norm,
    prepare_model,
    set_optimizer_hparams,
    use_bf16,
)
from trilm.train.init_from import open_init_from, resolve_init_from
from trilm.train.metrics import MetricsLogger, Throughput, memory_gb
from trilm.train.plan import RunPlan
from trilm.train.save_steps import snapshot_steps, state_steps
from trilm.train.state import (
    ResumePoint,
    branch_point,
    find_resume_point,
    load_state,
    needs_universal,
    prepare_universal,
    resolve_branch_from,
    save_state,
)


class TrainingAborted(RuntimeError):
    """Raised when training cannot continue (e.g. too many consecutive non-finite losses)."""


@dataclasses.dataclass
class TrainSummary:
    run_dir: str
    steps: int
    resumed_from: int | None
    skipped_steps: int
    final_loss: float | None
    val_losses: dict[int, float]
    snapshots: list[int]


def _open(path: str, key: str):
    """A model directory a config key names; a directory that cannot be opened is that key's error."""
    try:
        return open_model(path)
    except StoreError as exc:
        exc.args = (f"{key}: {exc}",)
        raise


class Trainer:
    def __init__(self, cfg: TrainConfig):
        self.source = open_init_from(cfg)
        """The snapshot of ``init_from``, opened once (weights read when the model is built)."""
        cfg = resolve_branch_from(resolve_init_from(cfg, self.source))
        self.cfg = cfg
        """The run's config, its model resolved from ``init_from`` where it takes it from there and a
        conversion's recipe filled in (:func:`trilm.train.convert.apply_recipe`)."""
        self.info = init_parallel(cfg.parallel)
        self.run = RunDir(cfg.run_dir)
        self.data = cfg.data.build(cfg.sequence_length)
        self.plan = RunPlan(cfg, self.info.dp_size, self.info.tp_size)
        self.accumulation = self.plan.accumulation
        self.model_cfg = cfg.model.resolved(self.info.tp_size)
        self.teacher_dir = _open(cfg.distill.teacher, "distill.teacher") if cfg.distill.enabled else None
        self._check_vocab()
        self.schedule = Schedule.for_optimizer(cfg.optim, cfg.schedule, cfg.steps)
        self.is_main = self.info.rank == 0
        self.step: int | None = None
        """The step being computed (None outside the training loop)."""
        self.branched_from: ResumePoint | None = None
        """The parent's state this run started from in this process (a cooldown branch's first launch)."""
        self.teacher: Teacher | None = None
        """The frozen float model of ``distill`` (built with the engine, on its device)."""
        self.conversion: dict | None = None
        """``{"from": family, "start": step}`` when this run converts a model of another family (its
        schedule and ramp then start at ``start``); set once the starting point is known."""
        self._distill_terms: list[torch.Tensor] = []

    def _check_vocab(self) -> None:
        data_hash = self.data.train.shards.tokenizer_hash
        if self.source is not None:
            recorded = self.source.meta.tokenizer_hash
            if recorded and recorded != data_hash:
                raise ConfigError(
                    f"init_from: {self.cfg.init_from} was trained with another tokenizer than the data in "
                    f"{self.cfg.data.train_dir}"
                )
        if self.teacher_dir is not None:
            teacher = self.teacher_dir
            check_teacher(teacher.config, self.model_cfg, self.cfg.distill.teacher)
            check_teacher_tokenizer(
                self.cfg.distill.teacher, teacher.meta.tokenizer_hash, data_hash, self.cfg.data.train_dir
            )
        tok = self.data.tokenizer
        if tok is not None and tok.vocab_size > self.model_cfg.padded_vocab:
            raise ConfigError(
                f"model.vocab_size: the tokenizer {self.cfg.data.tokenizer} has {tok.vocab_size} tokens, "
                f"more than the model's embedding ({self.model_cfg.padded_vocab})"
            )

    # ---- setup -----------------------------------------------------------------------------------------
    def _barrier(self) -> None:
        if dist.get_world_size() > 1:
            dist.barrier()

    def _build(self, load_universal: bool = False):
        torch.manual_seed(self.cfg.seed)
        model = Decoder(self.model_cfg, self.info, seed=self.cfg.seed)
        if self.source is not None:
            model.load_full_state_dict(self.source.weights.float_state())
        model = model.to(self.info.device)
        prepare_model(model, self.cfg)
        if self.teacher_dir is not None:
            bf16 = use_bf16(self.cfg)
            self.teacher = Teacher.load(self.teacher_dir, self.cfg.distill, self.model_cfg, self.info, bf16)
        return build_engine(model, self.cfg, self.accumulation, self.info, load_universal=load_universal)

    @contextlib.contextmanager
    def _locked_run_dir(self):
        """Rank 0 holds ``run_dir/.lock`` for the whole run; every rank refuses together if it is taken."""
        lock = RunLock(self.run.root) if self.is_main else None
        error = [None]
        if lock is not None:
            try:
                lock.acquire()
            except ConfigError as exc:
                error[0] = str(exc)
        if dist.get_world_size() > 1:
            dist.broadcast_object_list(error, src=0)
        if error[0] is not None:
            raise ConfigError(error[0])
        try:
            yield
        finally:
            if lock is not None:
                lock.release()

    def _write_run_files(self) -> None:
        if not self.is_main:
            return
        self.run.make()
        write_text(self.run.config, self.cfg.replace(model=self.model_cfg).to_yaml())
        tok = self.data.tokenizer
        if tok is not None:
            # under the names the loaders look for: a Hugging Face tokenizer.json (with its companions, the
            # chat template among them) copied as tokenizer.model would be read as SentencePiece and refused
            for name, source in tok.files.items():
                copy_file(source, self.run.root / name)
            main = self.run.root / next(iter(tok.files))
            write_json(sidecar_path(main), {"hash": tok.hash}, indent=None)

    def _check_run_dir(self) -> None:
        """The run directory belongs to this run: its recorded config equals ours (up to the keys that may
        change on a restart), or it holds no checkpoint at all. Checked before anything is written, also
        when no state exists yet (a run killed before its first state leaves snapshots behind)."""
        if not self.run.config.is_file():
            written = complete_steps(self.run.state) or complete_steps(self.run.snapshots)
            if written:
                raise ConfigError(
                    f"{self.run.root}: holds checkpoints but no {self.run.config.name}; refusing to mix "
                    "a new run into it (use a new run_dir)"
                )
            return
        try:
            saved = TrainConfig.from_yaml(self.run.config).to_dict()
        except ConfigError as exc:
            raise ConfigError(f"{self.run.config}: unreadable ({exc}); use a new run_dir") from None
        changed = changed_keys(saved, self.cfg.replace(model=self.model_cfg).to_dict())
        if changed:
            raise ConfigError(
                f"{self.run.config}: refusing to resume: {', '.join(changed)} differ from the saved run; "
                "use a new run_dir for a different run"
            )

    # ---- state ------------------------------------------------------------------------------------------
    def _save_state(self, engine, step: int, counters: dict) -> None:
        trainer_state = {
            "step": step,
            "tokens": step * self.cfg.batch_tokens,
            "data": self.data.train.state_dict(step * self.cfg.global_batch),
            "conversion": self.conversion,
            **counters,
        }
        ckpt = self.cfg.checkpoint
        save_state(engine, self.run, step, trainer_state, self.info, ckpt.keep_last, ckpt.keep_states_at)

    def _resume_point(self) -> ResumePoint | None:
        """This run's newest state; without one, the parent's state a branch starts from (if any)."""
        point = find_resume_point(self.run, self.info)
        if point is None and self.cfg.branch_from:
            point = branch_point(self.cfg.branch_from, self.cfg, self.info)
            self.branched_from = point
        if point is None:
            return None
        samples = self.data.train.check_resume(point.state["data"])
        if samples != point.step * self.cfg.global_batch:
            raise ConfigError(f"{point.path}: {samples} samples consumed does not match step {point.step}")
        if needs_universal(point, self.info, self.cfg.zero_stage):
            prepare_universal(point, self.info)
        return point

    def _conversion(self, point: ResumePoint | None) -> dict | None:
        """What this run converts from and where its phase starts (None: it converts nothing): an
        ``init_from`` of another family from step 0, a conversion branch from its branch point, and a
        resumed run as its state records it. A ``convert`` recipe on a run that converts nothing is
        refused."""
        family = self.model_cfg.family
        if self.source is not None:
            source = self.source.config.family
            found = {"from": source, "start": 0} if source != family else None
            where = f"init_from {self.cfg.init_from} is a {source}"
        elif point is not None and point is self.branched_from:
            found = {"from": point.source_family, "start": point.step} if point.source_family else None
            where = f"branch_from {self.cfg.branch_from} is a state of a {family}"
        else:
            found = point.state.get("conversion") if point is not None else None
            where = "this run's starting point is not of another family"
        if found is None and not self.cfg.convert.is_default:
            raise ConfigError(
                f"convert: {where} like this run, which so converts nothing (leave convert at its defaults)"
            )
        return found

    def _set_ramp(self, step: int) -> float | None:
        """λ of the conversion's ramp at ``step`` (None: the quantized weights), set for the step's
        forward and backward passes."""
        lam = None
        if self.conversion is not None:
            start = self.conversion["start"]
            lam = ramp_lambda(self.cfg.convert, step - start, self.cfg.steps - start)
        set_ramp(lam, self.info.device)
        return lam

    def _save_snapshot(self, engine, step: int, train_loss, val_loss) -> None:
        tokens = step * self.cfg.batch_tokens
        tok = self.data.tokenizer
        meta = model_meta(
            self.model_cfg,
            tp=self.info.tp_size,
            step=step,
            tokens=tokens,
            samples=step * self.cfg.global_batch,
            run=self.run.root.name,
            flops=flops_per_token(self.model_cfg, self.cfg.sequence_length) * tokens,
            tokenizer_hash=tok.hash if tok is not None else self.data.train.shards.tokenizer_hash,
            train_loss=train_loss,
            val_loss=val_loss,
            extra={**self._branch_meta(), **self._origin_meta()},
        )
        state = engine.module.full_state_dict()  # collective: every rank gathers
        with atomic_directory(self.run.snapshot(step), {"step": step}) as tmp:
            if self.is_main:
                write_snapshot_files(tmp, engine.module.cfg, meta, state)

    def _branch_meta(self) -> dict:
        """A branch's snapshots name the run and step it started from (``extra["branch"]``)."""
        if not self.cfg.branch_from:
            return {}
        path = Path(self.cfg.branch_from)
        step = int(path.name.rsplit("-", 1)[-1]) if path.name.startswith("step-") else None
        return {"branch": {"parent": path.parent.parent.name, "step": step, "state": str(path)}}

    def _origin_meta(self) -> dict:
        """A run started from another model names it (``extra["init_from"]``, with its family when it was
        converted) and its teacher (``extra["distill"]``), so a suite tells conversions from scratch runs."""
        out: dict = {}
        if self.source is not None:
            source = self.source.config
            out["init_from"] = {"path": self.cfg.init_from, "family": source.family, "name": source.name}
            out.update(self._tokenizer_facts())
        if self.cfg.distill.enabled:
            d = self.cfg.distill
            out["distill"] = {"teacher": d.teacher, "weight": d.weight, "temperature": d.temperature}
        if self.conversion is not None:
            out["conversion"] = {**self.conversion, "recipe": self._recipe()}
        return out

    def _recipe(self) -> dict:
        """The conversion's recipe as it ran: ``convert`` with the optimizer's default resolved."""
        recipe = self.cfg.convert.to_dict()
        if recipe["optimizer"] is None:
            recipe["optimizer"] = "keep" if self.cfg.branch_from else "reset"
        return recipe

    def _tokenizer_facts(self) -> dict:
        """What the ``init_from`` snapshot records about its tokenizer beyond the files (whether a prompt
        starts with BOS, the original BOS/EOS ids, llama.cpp's pre-tokenizer name), carried to this run's
        snapshots while the tokenizer is the same one: an import records them once, and a model trained
        from it exports to GGUF or Hugging Face as the import would, with no ``--tokenizer-pre`` to repeat."""
        assert self.source is not None
        tokenizer_hash = self.data.train.shards.tokenizer_hash
        if not tokenizer_hash or self.source.meta.tokenizer_hash != tokenizer_hash:
            return {}
        recorded = self.source.meta.extra
        out: dict = {key: recorded[key] for key in ("add_bos", "hf") if key in recorded}
        gguf = recorded.get("gguf", {})
        if gguf.get("tokenizer_hash") == tokenizer_hash:
            out["gguf"] = {
                k: gguf[k] for k in ("tokenizer_model", "tokenizer_pre", "tokenizer_hash") if k in gguf
            }
        return out

    # ---- evaluation -------------------------------------------------------------------------------------
    @torch.no_grad()
    def validation_loss(self, engine) -> float | None:
        valid = self.data.valid
        if valid is None:
            return None
        engine.eval()
        lam = ramp_value()
        set_ramp(None)  # a snapshot's loss is the loss of the model it holds: the TriLM, not the blend
        total = torch.zeros(2, dtype=torch.float64, device=self.info.device)
        for batch in valid.batches(self.cfg.micro_batch, self.info.dp_rank, self.info.dp_size):
            batch = batch.to(self.info.device)
            loss = engine(batch[:, :-1], labels=batch[:, 1:])
            total[0] += loss.double().sum()
            total[1] += loss.numel()
        set_ramp(lam, self.info.device)
        engine.train()
        dist.all_reduce(total, group=dp_group())
        return float(total[0] / total[1])

    def _micro_loss(self, engine, step: int, chunk: torch.Tensor) -> torch.Tensor:
        inputs, labels = chunk[:, :-1], chunk[:, 1:]
        if self.teacher is None:
            return engine(inputs, labels=labels).mean()
        target = self.teacher.log_probs(inputs)
        total, ce, kl = self.teacher.loss(engine(inputs), labels, target)
        self._distill_terms.append(torch.stack([ce, kl]))
        return total

    def _distill_values(self) -> dict:
        """The step's mean CE and KL of a distilled run (its ``loss`` is their weighted sum)."""
        if not self._distill_terms:
            return {}
        ce, kl = torch.stack(self._distill_terms).mean(0)
        self._distill_terms.clear()
        return {"ce": self._mean_over_dp(ce), "distill_kl": self._mean_over_dp(kl)}

    def _all_finite(self, loss: torch.Tensor) -> bool:
        flag = torch.isfinite(loss.detach()).to(torch.float32).reshape(1)
        if dist.get_world_size() > 1:
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item() > 0)

    # ---- the loop ---------------------------------------------------------------------------------------
    def fit(self) -> TrainSummary:
        if self.is_main:
            self.run.root.mkdir(parents=True, exist_ok=True)
        self._barrier()
        try:
            with self._locked_run_dir():
                return self._fit()
        except Exception as exc:
            self._report_failure(exc)
            raise

    def _report_failure(self, exc: Exception) -> None:
        """One line per rank naming where it stopped and what to do, ahead of the traceback: when a node
        dies, every other rank fails in its next collective, and this is what its log shows."""
        if self.step is None or self.info.world_size == 1:
            return
        newest = latest_complete(self.run.state)
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        print(
            f"trilm: rank {self.info.rank} (node {node_id()}) stopped in step {self.step + 1}: "
            f"{type(exc).__name__}: {first_line}\n"
            f"trilm: if a peer died or hung, every rank stops like this; the newest complete state is "
            f"{newest[1] if newest else 'none yet'}: rerun the same launch on every node to resume from it",
            file=sys.stderr,
            flush=True,
        )

    def _log_placement(self, logger: MetricsLogger, step: int) -> None:
        layout = placement(self.info)
        logger.event(step, "placement", "ranks per node", **layout)
        if layout["tensor_parallel_spans_nodes"] and self.is_main:
            warnings.warn(
                f"tensor-parallel groups span nodes (ranks per node: {layout['nodes']}): every layer's "
                "all-reduce crosses the network; run a multiple of parallel.tensor_parallel processes "
                "per node",
                RuntimeWarning,
                stacklevel=2,
            )

    def _fit(self) -> TrainSummary:
        cfg = self.cfg
        self._check_run_dir()
        point = self._resume_point()
        self.conversion = self._conversion(point)
        if self.conversion is not None:
            self.schedule = conversion_schedule(cfg, self.conversion["start"])
        self._write_run_files()
        self._barrier()
        engine = self._build(load_universal=point is not None and point.universal is not None)
        counters = {"skipped_steps": 0, "nonfinite_run": 0}
        start = 0
        if point is not None:
            load_state(engine, point, self.info)
            start = point.step
            counters.update({k: v for k, v in point.state.items() if k in counters})
            if point is self.branched_from and self.conversion and self.cfg.convert.optimizer == "reset":
                reset_moments(engine)
        self._barrier()
        logger = MetricsLogger(self.run.logs, self.is_main, cfg.log.tensorboard)
        self._log_placement(logger, start)
        if point is not None:
            for message in point.skipped:
                logger.event(start, "state_skipped", message)
            logger.event(
                start,
                "branch" if point is self.branched_from else "resume",
                f"from {point.path}"
                + (" (universal checkpoint: DP size changed)" if point.universal else ""),
                dp_size=self.info.dp_size,
                saved_dp_size=point.state["dp_size"],
                samples=point.state["data"]["samples_consumed"],
            )
        if self.conversion is not None and (point is None or point is self.branched_from):
            logger.event(
                start,
                "conversion",
                f"{self.conversion['from']} → {self.model_cfg.family}: {describe_recipe(cfg)}",
                schedule_start=start,
                recipe=self._recipe(),
            )
        snaps = set(snapshot_steps(cfg.checkpoint, cfg.steps))
        if self.schedule.cooldown_start:  # a WSD run's last stable-phase model: where its cooldown gains from
            snaps.add(self.schedule.cooldown_start)
        states = set(state_steps(cfg.checkpoint, cfg.steps))
        tokens_per_step = cfg.batch_tokens
        meter = Throughput(flops_per_token(self.model_cfg, cfg.sequence_length), self.info.world_size)
        val_losses: dict[int, float] = {}
        last_loss = None
        if start == 0 and 0 in snaps and not (self.run.snapshot(0) / COMPLETE).exists():
            val = self.validation_loss(engine)
            if val is not None:
                val_losses[0] = val
            self._save_snapshot(engine, 0, None, val)
        progress = self._progress(start)
        try:
            for step in range(start, cfg.steps):
                self.step = step
                for event in self.schedule.events_at(step):
                    logger.event(step, event.name, event.detail)
                lr, wd = self.schedule.lr(step), self.schedule.weight_decay(step)
                set_optimizer_hparams(engine, lr, wd)
                lam = self._set_ramp(step)
                t0 = time.perf_counter()
                batch = self.data.train.batch(step, cfg.global_batch, self.info.dp_rank, self.info.dp_size)
                batch = batch.to(self.info.device, non_blocking=True)
                t_data = time.perf_counter() - t0
                losses, finite = [], True
                self._distill_terms.clear()
                for chunk in batch.split(cfg.micro_batch):
                    loss = self._micro_loss(engine, step, chunk)
                    if not self._all_finite(loss):
                        finite = False
                        break
                    engine.backward(loss)
                    losses.append(loss.detach())
                if finite:
                    engine.step()
                    counters["nonfinite_run"] = 0
                else:
                    discard_gradients(engine)
                    counters["skipped_steps"] += 1
                    counters["nonfinite_run"] += 1
                    logger.event(step, "nonfinite_loss", "step skipped (optimizer update dropped)")
                    if counters["nonfinite_run"] >= cfg.log.max_nonfinite:
                        raise TrainingAborted(
                            f"loss was NaN/inf for {counters['nonfinite_run']} consecutive steps "
                            f"(up to step {step}); the last complete state is "
                            f"{latest_complete(self.run.state)}; lower optim.lr or check the data"
                        )
                done = step + 1
                meter.add(tokens_per_step, time.perf_counter() - t0, t_data)
                distilled = self._distill_values() if finite else {}
                if finite:
                    last_loss = self._mean_over_dp(torch.stack(losses).mean())
                if done % cfg.log.every == 0 or done == cfg.steps:
                    rates = meter.report()
                    values = {
                        "loss": last_loss,
                        "lr": lr,
                        "weight_decay": wd,
                        "grad_norm": global_grad_norm(engine) if finite else None,
                        "tokens": done * tokens_per_step,
                        "memory_gb": memory_gb(),
                        **({"ramp": 1.0 if lam is None else lam} if self.cfg.convert.ramp else {}),
                        **distilled,
                        **rates,
                    }
                    logger.log(done, values)
                    if progress is not None:
                        progress.set_postfix(
                            loss=f"{last_loss:.3f}" if last_loss else "nan",
                            lr=f"{lr:.2e}",
                            tok_s=f"{rates['tokens_per_s']:.0f}",
                        )
                val = None
                if done in snaps or (cfg.log.eval_every and done % cfg.log.eval_every == 0):
                    val = self.validation_loss(engine)
                    if val is not None:
                        val_losses[done] = val
                        logger.log(done, {"val_loss": val})
                if done in snaps:
                    self._save_snapshot(engine, done, last_loss, val)
                if done in states:
                    self._save_state(engine, done, counters)
                if progress is not None:
                    progress.update(1)
        finally:
            set_ramp(None)
            if progress is not None:
                progress.close()
            logger.close()
        return TrainSummary(
            run_dir=str(self.run.root),
            steps=cfg.steps,
            resumed_from=point.step if point else None,
            skipped_steps=counters["skipped_steps"],
            final_loss=last_loss,
            val_losses=val_losses,
            snapshots=sorted(snaps),
        )

    def _mean_over_dp(self, value: torch.Tensor) -> float:
        value = value.detach().float().reshape(1)
        if self.info.dp_size > 1:
            dist.all_reduce(value, group=dp_group())
            value /= self.info.dp_size
        return float(value.item())

    def _progress(self, start: int):
        if not (self.is_main and self.cfg.log.progress):
            return None

        return tqdm(
            total=self.cfg.steps, initial=start, desc=self.model_cfg.name, unit="step", dynamic_ncols=True
        )
