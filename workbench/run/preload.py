"""What every worker of `--jobs N` loads before its first run, imported once by the forkserver
that the workers are forked from (executor.worker_context, on a Linux machine without a GPU):
each worker starts with torch, Lightning and the training code already loaded instead of
loading them itself (about 6 s of CPU a worker on a 2-core CPU). Importing this module
is what loads them; only the forkserver's preload list names it."""

from workbench.importing import loading, own_process

own_process()  # the forkserver and its workers live as long as the study: what loads here is frozen out of collections
with loading("workbench.run.train"):
    import workbench.run.train  # noqa: F401  torch, Lightning and a run's own code
