"""The demo: the packaged model on the small sample that ships inside the package."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from attnscope.families import load_families
from attnscope.pipeline.config import RunConfig, RunOutcome
from attnscope.pipeline.outdir import STATE_FILE
from attnscope.pipeline.run import run_pipeline
from attnscope.progress import Progress
from attnscope.store.checkpoints import STATE_DIR


def demo_inputs() -> dict[str, Path]:
    """The packaged sample of every input of the demo's families (those with ``Family.demo``),
    by input name (written for attnscope, see ``demo_data/README.md``)."""
    root = Path(str(files("attnscope") / "demo_data"))
    return {inp.name: root / inp.sample for fam in load_families() if fam.demo
            for inp in fam.inputs if inp.sample}


def demo_config(model: str = "default", seed: int = 0) -> RunConfig:
    multiple = {inp.name for fam in load_families() for inp in fam.inputs if inp.multiple}
    return RunConfig(model=model, seed=seed, **{name: [p] if name in multiple else p
                                               for name, p in demo_inputs().items()})


def run_demo(out_dir: str | Path, *, model: str = "default", resume: bool = False,
             progress: Progress | None = None, command: str | None = None) -> RunOutcome:
    """The whole pipeline on the packaged sample; replaces an earlier demo run in ``out_dir``
    unless ``resume`` (a folder that is not an attnscope run is never deleted)."""
    out_dir = Path(out_dir)
    state = out_dir / STATE_DIR / STATE_FILE
    overwrite = not resume and state.exists()
    return run_pipeline(demo_config(model), out_dir, resume=resume, overwrite=overwrite,
                        progress=progress, command=command)
