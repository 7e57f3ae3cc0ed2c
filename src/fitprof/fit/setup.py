"""What a run was measured on, as each epoch's line of the per-epoch file records it (``"setup"``), so that
``fitprof compare`` can tell two runs of one setup from two setups: the backend, the model's parameter count and a
fingerprint of its structure, the precision and the device. Framework-free: the models are read by duck typing
(``parameters()`` / ``modules()`` of a torch module, ``count_params()`` / ``_flatten_layers()`` of a Keras model),
and every reading that fails leaves its field out rather than breaking the fit."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

__all__ = ["describe_setup", "keras_model_setup", "structure_fingerprint", "torch_module_setup"]


def structure_fingerprint(classes: Iterable[str]) -> str:
    """The first 12 hex digits of the SHA-256 of the layer (module) class names, in the order the model lists
    them, one a line. Class names, not layer names: Keras numbers a model's layers anew each time it is built
    (``dense_1``, ``dense_2``), which is no other model; another layer, or the same layers in another order, is."""
    return hashlib.sha256("\n".join(classes).encode("utf-8")).hexdigest()[:12]


def describe_setup(
    *,
    backend: str = "",
    parameters: int | None = None,
    classes: Iterable[str] | None = None,
    precision: str = "",
    device: str = "",
) -> dict[str, str]:
    """The ``setup`` of an epoch's line (:data:`fitprof.report_files.SETUP_FIELDS`), fields unknown left out:
    ``backend``; ``parameters``, the count of every parameter (trainable or not); ``structure``,
    :func:`structure_fingerprint` of ``classes``; ``precision`` as the framework names it (Keras's dtype policy
    ``mixed_float16``, Lightning's ``bf16-mixed``); ``device``, the accelerator's name, else its type (``cpu``)."""
    out = {"backend": backend, "precision": precision, "device": device}
    if parameters is not None and parameters >= 0:
        out["parameters"] = str(int(parameters))
    names = list(classes) if classes is not None else []
    if names:
        out["structure"] = structure_fingerprint(names)
    return {k: v for k, v in out.items() if v}


def torch_module_setup(module: Any, *, precision: str = "", device: str = "") -> dict[str, str]:
    """:func:`describe_setup` of a ``torch.nn.Module`` (a LightningModule): ``backend`` ``torch``, the parameters'
    ``numel()`` summed (left out while a lazy module's parameters are not materialised), the class names of
    ``module.modules()`` (the module itself first, depth first)."""
    try:
        parameters: int | None = sum(int(p.numel()) for p in module.parameters())
    except Exception:  # an uninitialised lazy parameter has no size yet
        parameters = None
    try:
        classes: list[str] | None = [type(m).__name__ for m in module.modules()]
    except Exception:
        classes = None
    return describe_setup(backend="torch", parameters=parameters, classes=classes, precision=precision, device=device)


def keras_model_setup(model: Any, *, backend: str = "", device: str = "") -> dict[str, str]:
    """:func:`describe_setup` of a Keras model: ``count_params()`` (left out while the model is not built), the
    class names of every layer (the model first, nested layers depth first, as Keras's own weight tracking walks
    them; the top-level ``layers`` where that walk is not there), and the dtype policy's name as the precision."""
    try:
        parameters: int | None = int(model.count_params())
    except Exception:  # not built yet: no weights to count
        parameters = None
    try:
        flatten = getattr(model, "_flatten_layers", None)
        layers = list(flatten(include_self=True, recursive=True)) if flatten else [model, *model.layers]
        classes: list[str] | None = [type(layer).__name__ for layer in layers]
    except Exception:
        classes = None
    policy = getattr(model, "dtype_policy", None)
    precision = str(getattr(policy, "name", "") or "")
    return describe_setup(backend=backend, parameters=parameters, classes=classes, precision=precision, device=device)
