"""The whole job in one call: raw inputs -> every analysis they allow -> one HTML report.

:func:`run_pipeline` is the library function behind ``attnscope run`` (and ``attnscope demo``).
It loops over the registered families (:mod:`attnscope.families`): each family whose first
input is given is run. The pipeline reads and checks every input before it writes anything
(each family's ``prepare``), loads the model once (with its masked-LM head when a family wants
it and the weights have one), then calls each family's ``run``, which writes its tables,
figures and ``results/<family>.json`` under the output folder and returns a
:class:`~attnscope.report.section.Section`. The pipeline then writes the head views of the best
heads (``views/``), a checkpoint per family (``run/<family>.json``: the section without its
maps, plus a fingerprint of everything that decides its numbers), the report
(``report.html``) and ``results.json`` (all results and the provenance), all through the one
strict-JSON serialisation of :mod:`attnscope.store.results`.

Resuming: a run that was interrupted is continued with ``resume=True``; families whose
checkpoint has the same fingerprint are not run again.

The package by job: :mod:`~attnscope.pipeline.config` (the run's configuration and its
checks), :mod:`~attnscope.pipeline.outdir` (the output folder), :mod:`~attnscope.pipeline.progress`,
:mod:`~attnscope.pipeline.sections` (checkpoints of sections), :mod:`~attnscope.pipeline.run`
(run order, :func:`run_pipeline`, :func:`run_family`, :func:`atlas`) and
:mod:`~attnscope.pipeline.demo`.
"""

from attnscope.pipeline.config import (
    MIN_MAX_SEQ_LEN,
    SHARED,
    RunConfig,
    RunOutcome,
    check_config,
    data_files,
)
from attnscope.pipeline.demo import demo_config, demo_inputs, run_demo
from attnscope.pipeline.outdir import refused_writes
from attnscope.pipeline.run import atlas, check_attention, run_family, run_order, run_pipeline

__all__ = ["MIN_MAX_SEQ_LEN", "SHARED", "RunConfig", "RunOutcome", "atlas", "check_attention", "check_config",
           "data_files", "demo_config", "demo_inputs", "refused_writes", "run_demo", "run_family", "run_order",
           "run_pipeline"]
