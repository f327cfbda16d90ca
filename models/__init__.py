"""Cost models: learn kernel time from measurements, rank configs, decide the cuBLAS fallback."""

from .artifact import CostModel, ModelError, load_model, shipped_model_path
from .predict import predict

__all__ = ["CostModel", "ModelError", "load_model", "predict", "shipped_model_path"]
