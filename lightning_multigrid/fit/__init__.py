"""What the Lightning shells apply during a fit, each piece usable without them.

``plan`` (the fit plan: every decision ``MultigridCallback`` takes before the first step, one pure
value) and ``facts`` (what the plan is decided from, read off the Trainer, the module and the
DataModule in one place); ``resume`` (an exact resume, or a refusal), ``rng`` (every rank's random
state in the checkpoint), ``batch_grid`` (does a batch have the planned grid), ``meter`` (the data
wait), ``step_log`` (what is logged, and when), ``precise_bn`` (BatchNorm statistics at the base
shape); for ``VideoClassifier``: ``recipe`` (its optimizer and LR options as one value) and
``multiview`` (a video's views averaged at test time).
"""
