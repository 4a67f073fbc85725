"""Hyperparameter sweeps: one Optuna study per sweep, its trials trained like any job.

``study``: where a team's studies live, the sampler and pruner a ``sweep`` section asks for, the search
space, resuming and warm starts, and a sweep's end (trials left running marked failed, the best chosen,
the summary). ``trials``: one trial's life inside its training task (asked, trained, stopped early or
told its value). The files through which a trial's workers hear whether to go on are the workers' side
(:mod:`trainyard.training.handshake`): the training imports nothing of sweeps.
"""
