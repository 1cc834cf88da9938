"""The figures a ladder page draws from the run it shows (matplotlib only, no framework imports):

* ``roofline``: every rung, and every kernel group of the fastest step, on the run's measured
  copy and matmul ceilings;
* ``memory``: per rung, what the step must hold (weights, gradients, AdamW moments,
  activations) computed from its shapes, beside the memory the run measured;
* ``timeline``: one step at the small batch and at the big ones, device kernels against the
  time the step took (and the host's dispatch time where the profiler recorded it);
* ``learning``: the learning check's loss curve, its validation points and its threshold.

The waterfall and the two-framework comparison are in ``perfladder.pages.plot``. Each module
returns data (tested for what it draws) and a figure built from that data.
"""
