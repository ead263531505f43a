"""Image input for Gemma 3's multimodal models (4B/12B/27B): decoding and preprocessing
(`images.py`), the settings (`config.py`), the projector into the text model (`projector.py`),
the encoder with its per-image cache (`encoder.py`) and the prompt's image-token layout
(`prompt.py`). The SigLIP tower itself is `engine/models/siglip.py`."""
