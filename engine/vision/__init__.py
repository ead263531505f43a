"""Image input for Gemma 3's multimodal models (4B/12B/27B): decoding and preprocessing
(`images.py`), the projector into the text model (`projector.py`), the encoder with its
per-image cache (`encoder.py`), the prompt's image-token layout (`prompt.py`) and where the
pictures sit in it (`spans.py`). The settings (`engine/vision_config.py`) and the SigLIP tower
(`engine/models/siglip.py`) live below this package: the weights and models import them."""
