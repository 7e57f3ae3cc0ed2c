"""One small module per profiler: start, mark a step, stop and export one window (``torch``: torch.profiler /
Kineto; ``tensorflow``: ``tf.profiler``). Each imports its framework; nothing else in fitprof's core does."""
