"""Training on the agent: run a job's worker as a subprocess and report what became of it.

==============  ==============================================================
logs.py         the bounded log file every run writes to
runs.py         TrainingRun: one worker's life, and the launcher protocol
process.py      the real launcher: a subprocess with the job's environment
environment.py  CUDA_VISIBLE_DEVICES, RANK, WORLD_SIZE, ... for a worker
power_limits.py the power limit a worker's GPUs are held to while it runs
reconcile.py    desired training -> running workers -> reported states
==============  ==============================================================
"""
