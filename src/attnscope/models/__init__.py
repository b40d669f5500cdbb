"""Model loading and the per-family table."""

from attnscope.models.families import MODEL_FAMILIES, ModelFamily, family_for
from attnscope.models.loading import DEFAULT_MODEL, LoadedModel, load_model, packaged_model_dir

__all__ = ["DEFAULT_MODEL", "MODEL_FAMILIES", "ModelFamily", "LoadedModel", "family_for", "load_model",
           "packaged_model_dir"]
