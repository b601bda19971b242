"""The retrieval node's settings: its knowledge base and search limits. Loaded like every role's
(edgeinspect/config.py RoleSettings: YAML, then EDGEINSPECT_* env)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from edgeinspect.config import RoleSettings


class RetrievalSettings(RoleSettings):
    kb_dir: Path = Field(..., description="knowledge-base folder written by `edgeinspect kb index`")
    max_k: int = Field(default=20, description="largest k a Search may ask for")
    reload_interval_s: float = Field(default=5.0, description="how often to look for a new index version on disk")
