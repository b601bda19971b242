"""A decoder stage: layers [start, end) of DeepSeek-VL's language model with a KV cache per session.

Stage 0 also embeds token ids and writes the aligned visual tokens over the image placeholders; the last stage also
applies the final norm and lm_head. Read in this order: load.py (which weights a stage holds, in which format),
steps.py (what a step takes and gives), executor.py (running steps for many sessions), layers.py (the layer paths,
one chosen per stage at load).
"""

from edgeinspect.models.stage.executor import KV_CACHE_FORMATS, PROMPT_BLOCK, StageExecutor
from edgeinspect.models.stage.load import LayerRange, StageModule, load_device_stage, load_stage
from edgeinspect.models.stage.steps import Session, StepInput, StepOutput, chunk_input, ids_tensor, step_positions

__all__ = [
    "KV_CACHE_FORMATS",
    "PROMPT_BLOCK",
    "LayerRange",
    "Session",
    "StageExecutor",
    "StageModule",
    "StepInput",
    "StepOutput",
    "chunk_input",
    "ids_tensor",
    "load_device_stage",
    "load_stage",
    "step_positions",
]
