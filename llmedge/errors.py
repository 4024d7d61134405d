"""The exception types llmedge raises on bad input; the CLI prints them as one line."""


class LlmedgeError(Exception):
    """Base of every error llmedge reports to a user (bad file, bad name, bad request)."""


class GGUFError(LlmedgeError):
    """A GGUF file is malformed or unsupported; the message says what is wrong and where."""


class TokenizerError(LlmedgeError):
    """The tokenizer metadata of a model is missing or inconsistent."""


class TemplateError(LlmedgeError):
    """A chat template failed to compile or render (including sandbox violations)."""


class StoreError(LlmedgeError):
    """A model name, manifest, blob or download is invalid or unavailable."""


class ModelNotFoundError(StoreError):
    """A model name that is valid but not in the store."""


class ModelError(LlmedgeError):
    """A model's architecture or hyperparameters are unsupported or inconsistent."""
