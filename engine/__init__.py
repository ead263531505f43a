"""Phoenix Chat's inference engine: model files, tokenizer, backends, sampling, generation. No Qt here."""
from engine.errors import PhoenixError
from engine.loader import LoadedModel, load
from engine.sampling import SamplingParams

__all__ = ["load", "LoadedModel", "SamplingParams", "PhoenixError"]
