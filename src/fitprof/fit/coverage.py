"""What one ``fit`` covered, and the one "nothing was profiled" warning with its real reason (both callbacks).

Each adapter records, during a fit, the facts only it can see (which epochs ran, how many training steps the
profiled epochs really had, counted by the callback itself when the framework reports none, whether another
profiler held the profiler, what limited the epochs); at the end of the fit :meth:`FitCoverage.message` turns
them into the warning, or None when something was profiled or nothing was meant to be. Stdlib only.
"""

from __future__ import annotations

from fitprof.fit.config import ProfileConfig


def suggest_profile_batch(steps: int, num_steps: int) -> str:
    """A ``profile_batch`` that fits epochs of ``steps`` training steps (``steps`` >= 1), as it is written.

    The window ends at the epoch's last step, holds at most ``num_steps`` steps and starts in the second half of
    the epoch when it can (the first steps hold compilation and warm-up); e.g. 3 steps -> ``(2, 3)``, 1 step ->
    ``1``, 8 steps and a 5-step window -> ``(5, 8)``.
    """
    last = steps
    first = max(steps // 2 + 1, steps - num_steps + 1, 1)
    return str(first) if first == last else f"({first}, {last})"


def short_window(epoch: int, steps_done: int, config: ProfileConfig, num_steps: int) -> str:
    """The warning for epoch ``epoch`` ending after step ``steps_done``, inside the window of ``config`` (this fit's
    steps): the ``profile_batch`` that fits epochs of that length (``num_steps``: the window's length as the user
    gave it), as the "nothing was profiled" warning suggests one, so that every epoch does not analyse a stub of a
    window."""
    fits = suggest_profile_batch(steps_done, num_steps) if steps_done >= 1 else ""
    return (
        f"fitprof: epoch {epoch} ended after step {steps_done}, inside the window (profile_batch="
        f"{config.first_step},{config.last_step}); the steps profiled so far are analysed."
        + (f" For epochs of {steps_done} steps, profile_batch={fits} fits." if fits else "")
    )


class FitCoverage:
    """The facts of one fit that say whether, and why not, a window was profiled.

    Args:
        config: the callback's checked settings.
    """

    def __init__(self, config: ProfileConfig) -> None:
        self.config = config
        self.begin_fit()

    def begin_fit(self) -> None:
        """Forget the previous fit."""
        self.epochs: list[int] = []  # every epoch that began (0-based, as the framework numbers them)
        self.profiled_epochs = 0  # epochs that ``every_n_epochs`` picks
        self.max_steps: int | None = None  # most training steps seen in one profiled epoch (None: none counted)
        self.windows = 0  # windows that opened
        self.blocked: str | None = None  # why a window could not start (another profiler), the first time
        self.limit: str | None = None  # what cut the epochs short (``fast_dev_run=True``, ``limit_train_batches=3``)
        self.said: bool = False  # an earlier warning already said that nothing is profiled in this fit
        self.left_out: bool = False  # ``ranks`` leaves this rank out (a choice, warned at the start if no rank is in)

    def epoch(self, epoch: int) -> None:
        """Record that ``epoch`` (0-based, as the framework numbers it) began."""
        self.epochs.append(epoch)
        if self.config.profiles_epoch(epoch):
            self.profiled_epochs += 1

    def steps(self, n: int) -> None:
        """Record that a profiled epoch had (at least) ``n`` training steps."""
        if self.max_steps is None or n > self.max_steps:
            self.max_steps = n

    def message(self, prefix: str) -> str | None:
        """The warning for a fit that profiled nothing, naming its reason; None when a window opened, profiling
        is off (``profile_batch=0``), no epoch ran, this rank was left out of every epoch by ``ranks`` (a
        choice, or already warned at the start), or an earlier warning already said nothing would be profiled.

        Following the suggestion it gives never gives the same warning for epochs of the same length.
        """
        cfg = self.config
        if self.windows or not cfg.enabled or not self.epochs or self.said or self.left_out:
            return None
        head = f"{prefix}nothing was profiled"
        if self.blocked is not None:
            return (
                f"{head}: another profiler held the profiler when the window (profile_batch={cfg.first_step},"
                f"{cfg.last_step}) was to start ({self.blocked}). Stop the other profiler, or give the two "
                "profilers different steps."
            )
        if self.profiled_epochs == 0:
            ran = (
                f"epoch {self.epochs[0]}" if len(self.epochs) == 1 else f"epochs {min(self.epochs)}-{max(self.epochs)}"
            )
            return (
                f"{head}: every_n_epochs={cfg.every_n_epochs} profiles epochs 0, {cfg.every_n_epochs}, "
                f"{2 * cfg.every_n_epochs}, ... (0-based) and this fit ran {ran} (a resume with initial_epoch or "
                "from a checkpoint numbers epochs from where it left off). Set every_n_epochs=1 to profile every "
                "epoch."
            )
        steps = self.max_steps or 0
        why = f" ({self.limit})" if self.limit else ""
        if steps == 0:
            return f"{head}: the epochs ran no training step{why}."
        return (
            f"{head}: the window starts at step {cfg.first_step} (profile_batch={cfg.first_step},{cfg.last_step}) "
            f"but the epochs had {steps} training step{'s' if steps != 1 else ''}{why}. Set profile_batch to steps "
            f"that exist, e.g. profile_batch={suggest_profile_batch(steps, cfg.num_steps)}."
        )
