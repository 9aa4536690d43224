"""Settings shared by several sections: a training budget and a LoRA shape."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TrainBudget(BaseModel):
    """How long a training loop may run: steps, batch, learning rate, validation cadence, early
    stopping patience (evaluations without improvement) and a wall-clock safety net in seconds
    (None: none). Each section sets its own defaults."""

    model_config = ConfigDict(extra="forbid")
    max_steps: int = Field(default=400, ge=1)
    batch_size: int = Field(default=8, ge=1)
    lr: float = Field(default=1e-3, gt=0)
    eval_every: int = Field(default=50, ge=1)
    patience: int = Field(default=4, ge=1)
    time_budget_s: float | None = 100.0


class LoraSettings(BaseModel):
    """A LoRA adapter's shape: rank ``r``, scaling ``alpha`` (update scaled by alpha / r), dropout."""

    model_config = ConfigDict(extra="forbid")
    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.05, ge=0, lt=1)
