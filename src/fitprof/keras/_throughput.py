"""Keras: the samples of a window's steps and the FLOPs of one training step, per backend.

Keras's batch hooks never see the batch, and on TensorFlow and JAX the batch is fetched inside the compiled step.
The samples of a window's steps are read from the data, as the always-on step timing reads them (the callback
hands each step's count to :meth:`KerasWork.step_ended`): on torch the batch each fetch returned, on TensorFlow
and JAX the batch size of Keras's data adapter (arrays, a ``tf.data`` pipeline with a static batch dimension)
times ``steps_per_execution``. A metric's count is not the batch size: a custom ``train_step`` that updates its
loss tracker with the mean loss (as the keras.io guide writes it) adds 1 a step, not 32. Where the data does not
say, Keras's own loss tracker is read instead (``model._loss_tracker.count``, which Keras's own ``train_step``
grows by each batch's samples), but only when the model runs Keras's own ``train_step``; otherwise the samples
are NaN with one warning.

FLOPs are counted on one step outside the window (the call before the window's warm-up call; the call after the
window when there is none, or no warm-up step), never on the warm-up step the profiler records, by wrapping
``model.train_function`` for that one call:

* TensorFlow: after the call, :func:`fitprof.profilers.flops_tf.train_step_flops` on the iterator's
  ``element_spec``, an unknown batch dimension set to the step's sample count (traced once a fit per input shape:
  tracing takes seconds; later windows reuse the count);
* torch: ``FlopCounterMode`` around the call (:mod:`fitprof.profilers.flops_torch`); ``count_items`` is called on
  that step's batch (the only backend where a callback can see one) and scaled by the window's samples;
* JAX: not counted (NaN, ``mfu_note`` says so).
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable
from typing import Any

from fitprof._batch import batch_size
from fitprof.throughput import CountItems, WorkLog, samples_unknown


def _keras_train_step(model: Any) -> bool:
    """Whether ``model`` runs Keras's own ``train_step`` (which grows the loss tracker by each batch's samples),
    not one of its own."""
    step = getattr(type(model), "train_step", None)
    return str(getattr(step, "__module__", "")).startswith("keras.")


def _samples_grown(model: Any, before: float) -> float:
    """The growth of Keras's sample count since ``before``, when Keras's own ``train_step`` grew it; else NaN."""
    if not _keras_train_step(model):
        return math.nan
    grown = _samples_seen(model) - before
    return grown if math.isfinite(grown) and grown > 0 else math.nan


def _samples_seen(model: Any) -> float:
    """Keras's running sample count of this epoch (``model._loss_tracker.count``); NaN when unreadable.

    Under a ``tf.distribute`` strategy the count is a sync-on-read variable: reading it whole is an all-reduce
    across the workers, which a rank that profiles alone (``ranks=[0]``) would run without its peers (they then
    fail in their next collective with mismatched types). Its local components are summed instead: this
    worker's samples, read with no collective."""
    try:
        import keras

        count = model._loss_tracker.count
        components = getattr(getattr(count, "value", None), "values", None)  # a tf.distribute variable's replicas
        if isinstance(components, tuple) and components:
            return float(sum(float(keras.ops.convert_to_numpy(c.read_value())) for c in components))
        return float(keras.ops.convert_to_numpy(count))
    except Exception:
        return math.nan


class KerasWork:
    """Collects one window's :class:`~fitprof.throughput.StepWork` for the Keras ``FitProfiler``: the engine's
    :class:`~fitprof.fit.result.Work` (the engine says when, this counts), per backend through its
    :class:`~fitprof.keras._backends.Backend` (``device_and_dtype``, ``count_flops``, ``count_items``)."""

    def __init__(
        self,
        backend: Any,
        count_items: CountItems | None,
        warn: Callable[[str], None],
        owner: Any,
        warn_samples: Callable[[str], None] | None = None,
    ) -> None:
        self.backend = backend
        self.log = WorkLog(count_items if backend.count_items else None, warn)
        self._warn_samples = warn_samples or warn
        self._step_samples: list[float] = []  # the data's samples of each step that ended in the window
        self._window_samples = math.nan  # their mean, fixed when the window closed
        self.data_batch: int | None = None
        """Samples per batch from Keras's data adapter (TensorFlow, JAX), set by the callback; None: unknown."""
        self.count_items = count_items
        self._owner = owner  # the callback: its ``model`` property syncs the JAX state into the model
        self._at_open = math.nan
        self._items_per_sample = math.nan
        self._restore: Callable[[], None] | None = None
        self._tf_counts: dict[tuple[int, str], tuple[float, str]] = {}  # (model, spec) -> (FLOPs, note), per fit
        self._off = ""  # why this fit counts no FLOPs ("" when it counts them)

    def __getstate__(self) -> dict[str, Any]:
        """Copy and pickle with the callback: a pending wrap of ``train_function`` belongs to the running fit."""
        return {**self.__dict__, "_restore": None, "_tf_counts": {}}

    @property
    def model(self) -> Any:
        return getattr(self._owner, "model", None)

    def begin_fit(self, model: Any, world: int = 1) -> None:
        """Find the device and compute dtype the MFU is measured against.

        With ``world`` > 1 ranks on TensorFlow no FLOPs are counted (NaN, with the reason): under a multi-worker
        ``tf.distribute`` strategy, tracing ``train_step`` again on the profiling ranks only can allocate
        collective keys on those ranks alone and put the ranks' later collectives out of step (the way reading the
        sample count whole did: "Collective instance 114 expected ... data_type 1 but got ... data_type 9", the fit
        aborted with ``ranks=0``; the samples are read per worker, with no collective).
        """
        self._tf_counts = {}
        self._off = (
            "not counted under a multi-worker tf.distribute strategy (it would desynchronise the ranks' collectives)"
            if self.backend.retraces_collectives and world > 1
            else ""
        )
        try:
            name, dtype = self.backend.device_and_dtype(model)
        except Exception:
            name, dtype = "", ""
        self.log.device_name, self.log.dtype = name, dtype
        # Convolutions can run float32 in another precision than matrix products (cuDNN's TF32, on by default).
        try:
            self.log.conv_dtype = torch_conv_dtype(model) if self.backend.name == "torch" and name else ""
        except Exception:
            self.log.conv_dtype = ""

    def epoch_start(self) -> None:
        self.log.reset()
        self._at_open = math.nan
        self._items_per_sample = math.nan
        self._step_samples = []
        self._window_samples = math.nan
        if self.backend.count_flops is None:
            self.log.flops_note = f"FLOPs are not counted on the Keras {self.backend.label} backend"
        elif self._off:
            self.log.flops_note = f"FLOPs {self._off}"

    def window_opened(self) -> None:
        self._at_open = _samples_seen(self.model)
        self._step_samples = []
        self._window_samples = math.nan

    def step_ended(self, samples: int | None) -> None:
        """A step of the open window ended; ``samples``: its batch's samples as the data gives them (None:
        unknown)."""
        self._step_samples.append(math.nan if not samples else float(samples))

    def window_step(self, batch: Any) -> None:
        pass  # Keras's batch hooks never see the batch: the samples come from the loss tracker

    def window_closed(self) -> None:
        self._window_samples = self._data_samples()  # later steps (a triggered window's) are not this window's
        if math.isfinite(self._window_samples):
            return  # the data said: work() gives their mean
        total = _samples_seen(self.model) - self._at_open if _keras_train_step(self.model) else math.nan
        if math.isfinite(total) and total > 0:
            self.log.set_window_samples(total)
        else:
            self._warn_samples(
                samples_unknown(
                    "the data gives no batch size (a generator, or a tf.data pipeline without a static batch "
                    "dimension) and the model has its own train_step, whose metrics do not count samples",
                    "give the data a static batch size (e.g. dataset.batch(n, drop_remainder=True)) to have them",
                )
            )

    def _data_samples(self) -> float:
        """The mean samples of the window's steps as the data gave them (NaN: not known for every step)."""
        data = self._step_samples
        return sum(data) / len(data) if data and all(math.isfinite(n) for n in data) else math.nan

    def count_flops(self, step: int, batch: Any) -> None:
        """Wrap ``model.train_function`` for its next call only (step ``step``), and count that step's FLOPs."""
        model, count = self.model, self.backend.count_flops
        if count is None or self._off or self._restore is not None or model is None:
            return
        original = getattr(model, "train_function", None)
        if original is None:
            return

        def restore() -> None:
            self._restore = None
            if model.__dict__.get("train_function") is counting:
                model.train_function = original

        def counting(*args: Any, **kwargs: Any) -> Any:
            restore()
            return count(self, model, original, _samples_seen(model), *args, **kwargs)

        model.train_function = counting
        self._restore = restore

    def restore(self) -> None:
        """Unwrap ``model.train_function`` if its counted call never came (the fit ended first)."""
        if self._restore is not None:
            self._restore()

    def _count_tf(self, model: Any, iterator: Any, samples: float) -> None:
        import tensorflow as tf

        from fitprof.profilers.flops_tf import static_batch

        spec = getattr(iterator, "element_spec", None)
        replicas = _replicas(spec)
        if spec is not None and math.isfinite(samples) and samples > 0:
            samples = samples / replicas  # one replica's share of the batch (what a replica's step holds)

            def concrete(s: Any) -> Any:
                if isinstance(s, tf.TensorSpec) and s.shape.rank and s.shape[0] is None:
                    return tf.TensorSpec([int(samples), *s.shape[1:]], s.dtype, s.name)
                return s

            spec = tf.nest.map_structure(concrete, spec)
        # Tracing the step again takes seconds (2-5 s for the digits CNN on a loaded 2-core machine): once a fit
        # for each input shape.
        key = (id(model), repr(spec))
        if key not in self._tf_counts:
            self._tf_counts[key] = _replica_step_flops(model, spec)
        flops, note = self._tf_counts[key]
        # The FLOPs are those of one train_step on the traced batch (``steps_per_execution`` calls hold several).
        # Under a one-process strategy (MirroredStrategy) the count is one replica's step on its share of the
        # batch, and MFU is one device's: each replica runs its step on its own device in the same step time.
        # ``flops_samples`` is then the whole batch, so the count is not scaled up to every replica's work.
        traced = static_batch(_one_replica(spec)) * replicas if spec is not None else math.nan
        self.log.set_flops(flops, traced, note)

    def _count_torch(self, model: Any, original: Any, before: float, *args: Any, **kwargs: Any) -> Any:
        from fitprof.profilers.flops_torch import TorchFlopCount

        counter = TorchFlopCount()
        counter.start()
        try:
            out = original(*args, **kwargs)
        finally:
            flops = counter.stop()
        # ``data`` is the list of the call's batches (``steps_per_execution`` of them); the FLOPs cover them all.
        data = args[0] if args else None
        first = data[0] if isinstance(data, (list, tuple)) and data else data
        n = batch_size(first)  # from the data; Keras's own loss tracker only where the data does not say
        if n is not None:
            samples = float(n) * (len(data) if isinstance(data, (list, tuple)) else 1)
        else:
            samples = _samples_grown(model, before)
        self.log.set_flops(
            flops, samples, counter.note, conv_flops=counter.conv_flops, recompute_flops=counter.recompute_flops
        )
        if self.count_items is not None and n:
            self.log.add_items(first, per_sample_of=float(n))
        return out

    def work(self) -> Any:
        work = self.log.work()
        samples = self._window_samples
        if math.isfinite(samples):
            work = dataclasses.replace(work, samples_per_step=samples, samples_total=math.nan)
        return work


def _replicas(spec: Any) -> int:
    """How many replicas a ``tf.distribute`` iterator's ``element_spec`` feeds (``PerReplicaSpec``: one spec a
    replica); 1 for a plain spec."""
    import tensorflow as tf

    for s in tf.nest.flatten(spec):
        values = getattr(s, "_value_specs", None)
        if values:
            return len(values)
    return 1


def _one_replica(spec: Any) -> Any:
    """The spec of one replica's batch: each ``PerReplicaSpec`` replaced by its first replica's spec."""
    import tensorflow as tf

    def first(s: Any) -> Any:
        values = getattr(s, "_value_specs", None)
        return values[0] if values else s

    return tf.nest.map_structure(first, spec) if spec is not None else None


def _replica_step_flops(model: Any, spec: Any) -> tuple[float, str]:
    """FLOPs of one replica's ``train_step`` (:func:`fitprof.profilers.flops_tf.train_step_flops` on one replica's
    spec). Traced as one replica's plain step, in a thread of its own: ``fit`` runs in the strategy's scope,
    which is per thread, and in it the gradient of a mirrored variable cannot be taken outside ``strategy.run``;
    tracing runs nothing and changes no weight."""
    from fitprof.profilers.flops_tf import train_step_flops

    if _replicas(spec) == 1:
        return train_step_flops(model, spec)
    one = _one_replica(spec)
    out: list[tuple[float, str]] = []
    thread = threading.Thread(target=lambda: out.append(train_step_flops(model, one)), name="fitprof-flops")
    thread.start()
    thread.join()
    return out[0] if out else (math.nan, "the replica's training step could not be traced for counting")


def count_tf(work: KerasWork, model: Any, original: Any, before: float, *args: Any, **kwargs: Any) -> Any:
    """TensorFlow: run the step, then count its FLOPs from the shapes of the traced ``train_step``."""
    out = original(*args, **kwargs)
    try:
        # one train_step's batch (a call holds steps_per_execution of them): from the data where it says
        per_step = float(work.data_batch) if work.data_batch else math.nan
        if not math.isfinite(per_step):
            per_step = _samples_grown(model, before)
        work._count_tf(model, args[0] if args else None, per_step)
    except Exception as err:  # a profiling problem never breaks the training step: NaN, with the reason
        work.log.set_flops(math.nan, math.nan, f"FLOPs not counted ({err!r})")
    return out


def count_torch(work: KerasWork, model: Any, original: Any, before: float, *args: Any, **kwargs: Any) -> Any:
    """torch: run the step inside ``FlopCounterMode``."""
    return work._count_torch(model, original, before, *args, **kwargs)


def tf_device_and_dtype(model: Any) -> tuple[str, str]:
    from fitprof.profilers.flops_tf import device_and_dtype

    return device_and_dtype(model)


def torch_device_and_dtype(model: Any) -> tuple[str, str]:
    import torch

    from fitprof.profilers.flops_torch import compute_dtype, device_name

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return device_name(device), compute_dtype(str(model.dtype_policy.compute_dtype), device)


def torch_conv_dtype(model: Any) -> str:
    """The compute dtype of the model's convolutions on torch (:func:`fitprof.profilers.flops_torch.conv_compute_dtype`)."""
    import torch

    from fitprof.profilers.flops_torch import conv_compute_dtype

    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    return conv_compute_dtype(str(model.dtype_policy.compute_dtype), device)


def jax_device_and_dtype(model: Any) -> tuple[str, str]:
    import jax

    device = jax.devices()[0]
    return (str(device.device_kind) if device.platform == "gpu" else ""), str(model.dtype_policy.compute_dtype)
