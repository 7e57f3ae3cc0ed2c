"""Advice fits the framework and the pipeline in the trace: JAX is labelled JAX and gets JAX advice (no Keras
``steps_per_execution`` / ``jit_compile``, no ``tf.data``); ``tf.data`` advice only when ``tf.data`` is in the
trace, and never a tip the pipeline already follows. Read from real traces: the shipped Keras TensorFlow window
(whose pipeline is ``shuffle().map().batch()``), and a ``jax.profiler`` trace made here."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

import fitprof
from fitprof import analyze_table, read_trace
from fitprof.analysis import advice_for
from shared_fixtures import KERAS_XSPACE

KERAS_HINTS = ("steps_per_execution", "jit_compile", "tf.data", ".prefetch", "num_workers")


def test_tf_data_advice_follows_the_pipeline_in_the_trace() -> None:
    table = read_trace(KERAS_XSPACE)
    report = analyze_table(table)
    assert report.framework == "tensorflow" and report.verdict == "input-bound"
    # the pipeline (Iterator::Root::MapAndBatch::Shuffle) has no prefetch and no cache: both are advised
    assert any(".prefetch(tf.data.AUTOTUNE)" in a for a in report.advice)
    assert any(".cache()" in a for a in report.advice)

    names = table["name"].astype(str)
    iterator = names.str.startswith("Iterator::")
    assert iterator.any()
    prefetched = table.copy()
    prefetched["name"] = names.where(~iterator, names.str.replace("Iterator::Root::", "Iterator::Root::Prefetch::"))
    advice = analyze_table(prefetched).advice
    assert not any(".prefetch" in a for a in advice) and any(".cache()" in a for a in advice), advice

    no_tf_data = table.copy()
    no_tf_data["name"] = names.where(~iterator, "python_generator_next")  # the same spans, not tf.data's
    advice = analyze_table(no_tf_data).advice
    assert not any("tf.data" in a and "not come from" not in a for a in advice), advice
    assert any("PyDataset" in a for a in advice)


def test_a_pipeline_that_follows_every_tip_is_told_its_source_is_the_limit() -> None:
    advice = advice_for(
        "input-bound",
        "tensorflow",
        pageable_share=0.0,
        top=None,
        tf_data=frozenset({"Root", "Prefetch", "ParallelMapV2", "Cache"}),
    )
    assert len(advice) == 1 and "already prefetches" in advice[0]


@pytest.mark.parametrize("verdict", ["input-bound", "overhead-bound", "host-bound", "communication-bound"])
def test_jax_advice_names_no_keras_or_tf_data_setting(verdict: str) -> None:
    advice = " ".join(advice_for(verdict, "jax", pageable_share=0.0, top=None, tf_data=frozenset({"Root"})))
    assert not any(hint in advice for hint in KERAS_HINTS), advice
    if verdict != "communication-bound":
        assert "block_until_ready" in advice


def test_a_jax_profiler_trace_is_labelled_jax(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    step = jax.jit(lambda x: (x @ x).sum())
    x = jnp.ones((64, 64))
    step(x).block_until_ready()
    jax.profiler.start_trace(str(tmp_path))
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            step(x).block_until_ready()
    jax.profiler.stop_trace()
    (path,) = glob.glob(str(tmp_path / "**" / "*.xplane.pb"), recursive=True)
    report = fitprof.analyze(path)
    assert report.framework == "jax"
    assert report.steps_analyzed == 3
    assert not any(hint in " ".join(report.advice) for hint in KERAS_HINTS), report.advice
    assert fitprof.analyze(KERAS_XSPACE).framework == "tensorflow"  # TensorFlow stays TensorFlow
